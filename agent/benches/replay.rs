//! Replay reconciliation (`cairn_agent::replay::reconcile`): a client resends a 4 MB
//! conversation — prompts, `read_file` calls, their 2.5 KB outputs, answers — plus one new
//! question, and the session finds where the new items start. Measured on the parsed items
//! (the JSON parse of the body is the HTTP layer's, as for any request).
//!
//! `cargo bench -p cairn-agent --bench replay`

use cairn_agent::history::ToolCall;
use cairn_agent::replay::{Api, Held, Incoming, Item, ItemRole, Ledger, output_items, reconcile};
use criterion::{Criterion, criterion_group, criterion_main};

#[global_allocator]
static ALLOCATOR: cairn_agent::allocator::Allocator = mimalloc::MiMalloc;

fn message(role: ItemRole, text: String) -> Item {
    Item::Message {
        role,
        text,
        images: Vec::new(),
    }
}

/// A conversation of about `bytes` and the ledger a session holds for it.
fn conversation(bytes: usize) -> (Vec<Incoming>, Ledger) {
    let mut conv = Vec::new();
    let mut ledger = Ledger::default();
    let mut size = 0;
    let mut n = 0;
    let mut pending: Vec<Item> = Vec::new();
    while size < bytes {
        let mut new = std::mem::take(&mut pending);
        if n % 4 == 0 {
            new.push(message(
                ItemRole::User,
                format!("step {n}: look at the next module and tell me what changed"),
            ));
        }
        let call = ToolCall {
            id: format!("call_{n:06}"),
            name: "read_file".into(),
            arguments: format!(r#"{{"path": "src/module_{n}.rs", "start": 1, "end": 80}}"#),
        };
        let text = if n % 4 == 3 {
            format!("Module {n} looks fine; the change is in the error path.")
        } else {
            String::new()
        };
        ledger.items.extend(new.iter().map(Held::input));
        let outputs = output_items(&text, std::slice::from_ref(&call));
        ledger.complete(
            outputs
                .iter()
                .map(|(item, id)| Held::output(item, id.clone()))
                .collect(),
            format!("resp_{n}"),
        );
        conv.extend(new.into_iter().map(|item| Incoming { item, id: None }));
        conv.extend(outputs.into_iter().map(|(item, id)| Incoming { item, id }));
        let output: String = (0..80)
            .map(|l| format!("{l:4} fn item_{n}_{l}() {{ compute({l}, {n}); }}\n"))
            .collect();
        size += output.len() + 200;
        pending.push(Item::FunctionCallOutput {
            call_id: call.id,
            output,
        });
        n += 1;
    }
    conv.extend(pending.into_iter().map(|item| Incoming { item, id: None }));
    conv.push(Incoming {
        item: message(ItemRole::User, "and now?".into()),
        id: None,
    });
    (conv, ledger)
}

fn bench(c: &mut Criterion) {
    cairn_agent::allocator::configure();
    let (input, ledger) = conversation(4 << 20);
    let bytes: usize = input
        .iter()
        .map(|i| match &i.item {
            Item::Message { text, .. } => text.len(),
            Item::FunctionCall { arguments, .. } => arguments.len(),
            Item::FunctionCallOutput { output, .. } => output.len(),
        })
        .sum();
    eprintln!(
        "{} items, {bytes} bytes, {} held",
        input.len(),
        ledger.items.len()
    );
    let expected = ledger.items.len();
    let mut g = c.benchmark_group("replay");
    g.sample_size(50);
    for (name, api) in [("responses_4mb", Api::Responses), ("chat_4mb", Api::Chat)] {
        g.bench_function(name, |b| {
            b.iter(|| {
                let from = reconcile(&ledger, api, &input, None);
                assert_eq!(from, Ok(expected));
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
