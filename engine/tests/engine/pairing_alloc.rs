//! Pairing repair allocates nothing when the history needs no repair (it runs every turn).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use cairn_engine::ccr::MemoryStore;
use cairn_engine::compact::Trigger;
use cairn_engine::compact::pairing::{self, OrphanMode};
use cairn_engine::history::{Message, ToolCall};

/// Counts the allocations of each thread: the other tests of this binary run on threads of
/// their own and do not disturb the count.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

/// Allocations made so far by the calling thread.
fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // A const-initialised `Cell<usize>` needs no allocation and no destructor.
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn valid_history_is_checked_and_repaired_without_allocating() {
    let mut h = vec![Message::system("s"), Message::user("go")];
    for n in 0..50 {
        let calls = (0..3)
            .map(|k| ToolCall {
                id: format!("c{n}_{k}"),
                name: "read_file".into(),
                arguments: "{}".into(),
            })
            .collect();
        h.push(Message::assistant_calls("", calls));
        for k in (0..3).rev() {
            h.push(Message::tool(format!("c{n}_{k}"), "out"));
        }
        h.push(Message::assistant("ok"));
    }
    let before = allocations();
    let valid = pairing::is_valid(&h);
    let report = pairing::repair(&mut h, OrphanMode::Remove);
    let after = allocations();
    assert!(valid);
    assert!(!report.is_change());
    assert_eq!(after - before, 0, "no allocation on the happy path");

    // The function a turn calls, with its store, allocates nothing either.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let store = MemoryStore::new();
    rt.block_on(pairing::repair_archived(&mut h, &store, Trigger::Turn));
    let before = allocations();
    let (pass, report) = rt.block_on(pairing::repair_archived(&mut h, &store, Trigger::Turn));
    let after = allocations();
    assert!(!report.is_change() && pass.archived.is_empty());
    assert_eq!(
        after - before,
        0,
        "no allocation in repair_archived on a valid history"
    );

    // A broken history does get repaired (the counter is not vacuous).
    h.push(Message::tool("orphan", "x"));
    let before = allocations();
    pairing::repair(&mut h, OrphanMode::Remove);
    assert!(allocations() > before);
    assert!(pairing::is_valid(&h));
}
