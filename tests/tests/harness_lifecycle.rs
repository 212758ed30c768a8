//! The harness never leaves a process behind: not on an orderly stop (SIGTERM), and not when
//! it is killed outright (SIGKILL), whatever it had started.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn start_harness(env_file: &Path) -> Child {
    let _ = std::fs::remove_file(env_file);
    Command::new(env!("CARGO_BIN_EXE_cairn-harness"))
        .args(["up", "--env-file"])
        .arg(env_file)
        .stdin(Stdio::null())
        .spawn()
        .expect("cairn-harness starts")
}

/// PIDs of every component, from the env file the harness writes once it is up.
fn wait_for_pids(env_file: &Path, harness: &mut Child) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        if let Ok(text) = std::fs::read_to_string(env_file)
            && let Some(line) = text.lines().find(|l| l.starts_with("CAIRN_HARNESS_PIDS="))
        {
            let pids: Vec<i32> = line
                .trim_start_matches("CAIRN_HARNESS_PIDS=")
                .trim_matches('"')
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect();
            return pids;
        }
        if let Ok(Some(status)) = harness.try_wait() {
            panic!("cairn-harness exited before it was up: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "cairn-harness was not up within 240 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn alive(pid: i32) -> bool {
    // A zombie has exited; only its parent has not reaped it yet.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

fn assert_all_gone(pids: &[i32], how: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while pids.iter().any(|&p| alive(p)) {
        assert!(
            Instant::now() < deadline,
            "after {how}, still running: {:?}",
            pids.iter().filter(|&&p| alive(p)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn no_process_survives_the_harness() {
    let dir = std::env::temp_dir().join(format!("harness-lifecycle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");

    // Orderly stop.
    let env_file = dir.join("term.env");
    let mut harness = start_harness(&env_file);
    let pids = wait_for_pids(&env_file, &mut harness);
    assert!(
        pids.len() >= 6,
        "etcd, apiserver, controller-manager, scheduler, kwok and S3: {pids:?}"
    );
    assert!(
        pids.iter().all(|&p| alive(p)),
        "all components run while the harness is up"
    );
    // SAFETY: signalling a child we started.
    unsafe { libc::kill(harness.id() as i32, libc::SIGTERM) };
    let status = harness.wait().expect("harness exits");
    assert!(status.success(), "orderly stop exits 0: {status}");
    assert_all_gone(&pids, "SIGTERM");
    assert!(
        !env_file.exists(),
        "the env file is removed on an orderly stop"
    );

    // Killed outright: the components die with it (parent-death signal).
    let env_file = dir.join("kill.env");
    let mut harness = start_harness(&env_file);
    let pids = wait_for_pids(&env_file, &mut harness);
    harness.kill().expect("SIGKILL");
    let _ = harness.wait();
    assert_all_gone(&pids, "SIGKILL");
    let _ = std::fs::remove_dir_all(&dir);
}
