//! `cairn-demo [--keep] [--kwok]`: the whole system on this machine (see `cairn_tests::demo`),
//! its pods on a real node (kubelet, containerd, runc) or, with `--kwok` or on a machine that
//! cannot run one, on kwok's fake node. With `--keep` everything stays up until Ctrl-C, and
//! the demo prints how to reach it.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use cairn_tests::demo::{self, DemoOptions};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn main() -> ExitCode {
    let keep = std::env::args().any(|a| a == "--keep");
    let kwok = std::env::args().any(|a| a == "--kwok");
    let started = std::time::Instant::now();
    let mut say = |m: &str| println!("[cairn-demo {:>5.1}s] {m}", started.elapsed().as_secs_f64());
    let real_node = !kwok
        && match demo::real_node_unsupported() {
            None => true,
            Some(why) => {
                say(&format!(
                    "no real node on this machine ({why}): using kwok's node"
                ));
                false
            }
        };
    let opts = DemoOptions {
        bin_dir: demo::default_bin_dir(),
        real_node,
        ..DemoOptions::default()
    };
    let demo = match demo::start(&opts, &mut say) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("cairn-demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    let report = match demo.drive(&opts, &mut say) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cairn-demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("\n$ kubectl get asess -n demo -o wide\n{}", report.table);
    let s = &report.session["status"]["session"];
    println!("recovery counters (status.session):");
    for key in [
        "turns",
        "compactions",
        "level3Compactions",
        "summaries",
        "recoveries",
        "learnedPayloadCap",
        "utilization",
    ] {
        println!("  {key:<18} {}", s[key]);
    }
    println!("  {:<18} {}", "lastRecovery", s["lastRecovery"]);
    println!("  {:<18} {}", "archive", s["archive"]);
    println!(
        "nginx answered 413 {} time(s); {} of {} turns answered",
        report.proxy_413s, report.answered, opts.turns
    );
    println!("\nthe agent's Events on the session (kubectl describe asess demo -n demo):");
    for e in &report.events {
        let times = if e.count > 1 {
            format!(" (x{})", e.count)
        } else {
            String::new()
        };
        println!("  {:<10} {}{times}", e.reason, e.note);
    }
    println!("\nthe ladder at work, as those Events show it:");
    let seen = report.levels_seen();
    for (level, pass, what) in demo::LEVELS {
        let mark = if seen.contains(&level) { "yes" } else { "no " };
        println!("  {mark} level {level} ({pass}): {what}");
    }
    let mark = if report.recovered() { "yes" } else { "no " };
    println!("  {mark} recovery: a rejected request shrunk and retried");
    if keep {
        // SAFETY: installing a handler that only stores to an atomic.
        unsafe {
            libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
            libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        }
        println!("\nStill running; Ctrl-C stops everything.");
        println!("  export KUBECONFIG={}", demo.cp.kubeconfig.display());
        println!("  alias kubectl={}", demo.cp.kubectl.display());
        println!(
            "  curl -H 'Authorization: Bearer {}' {}/v1/session",
            demo.token, demo.agent_url
        );
        while !STOP.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
    println!("cairn-demo: tearing down");
    drop(demo);
    ExitCode::SUCCESS
}
