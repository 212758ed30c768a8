//! `cairn-harness`: bring the local environment up for people and scripts.
//!
//!   cairn-harness up [--env-file FILE] [--crds] [--bin-dir DIR] [--no-pods]
//!
//! Starts the control plane, an S3 server and the pod runtime (cairn's images run as the
//! binaries in DIR, default: the Cargo target directory's `debug/`), writes an env file
//! (KUBECONFIG, KUBECTL, HELM, CAIRN_S3_ENDPOINT, CAIRN_PODS — the runtime's `pods.json` —
//! and the PIDs of every component) and stays in the foreground until SIGINT/SIGTERM, then
//! stops everything. Killing it with SIGKILL stops everything too. `--no-pods` starts no pod
//! runtime: kwok marks pods Running and nothing runs them (the operator's scale test).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use cairn_tests::harness::{
    ControlPlane, HarnessError, PodRuntime, S3Server, helm, run_dir, runtime, s3,
};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) != Some("up") {
        eprintln!("usage: cairn-harness up [--env-file FILE] [--crds] [--bin-dir DIR] [--no-pods]");
        return ExitCode::from(2);
    }
    let env_file = args
        .iter()
        .position(|a| a == "--env-file")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from);
    let crds = args.iter().any(|a| a == "--crds");
    // Scale runs: kwok marks pods Running and nothing runs them (no agent processes).
    let pods = !args.iter().any(|a| a == "--no-pods");
    let bin_dir = args
        .iter()
        .position(|a| a == "--bin-dir")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from)
        .unwrap_or_else(default_bin_dir);
    match up(env_file, crds, pods, &bin_dir) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cairn-harness: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The directory this binary was built into (cairn's other binaries sit beside it).
fn default_bin_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("target/debug"))
}

fn up(
    env_file: Option<PathBuf>,
    crds: bool,
    run_pods: bool,
    bin_dir: &std::path::Path,
) -> Result<(), HarnessError> {
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let started = std::time::Instant::now();
    let dir = run_dir("harness")?;
    let cp = ControlPlane::start(&dir)?;
    let s3 = S3Server::start(&dir.join("logs"), &["cairn"])?;
    if crds {
        cp.install_crds()?;
    }
    let helm = helm()?;
    let pods = if run_pods {
        Some(PodRuntime::start(&cp, runtime::cairn_images(bin_dir), "")?)
    } else {
        None
    };
    let mut env = format!(
        "KUBECONFIG={}\nKUBECTL={}\nHELM={}\nCAIRN_PODS={}\nCAIRN_HARNESS_DIR={}\nCAIRN_S3_ENDPOINT={}\nCAIRN_S3_BUCKET=cairn\nCAIRN_S3_REGION={}\nAWS_ACCESS_KEY_ID={}\nAWS_SECRET_ACCESS_KEY={}\n",
        cp.kubeconfig.display(),
        cp.kubectl.display(),
        helm.display(),
        dir.join("pods/pods.json").display(),
        dir.display(),
        s3.endpoint,
        s3::REGION,
        s3::ACCESS_KEY_ID,
        s3::SECRET_ACCESS_KEY,
    );
    let mut pids: Vec<String> = cp.pids().iter().map(|(_, p)| p.to_string()).collect();
    pids.extend(s3.pid().map(|p| p.to_string()));
    env.push_str(&format!("CAIRN_HARNESS_PIDS=\"{}\"\n", pids.join(" ")));
    match &env_file {
        Some(path) => {
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, &env)
                .map_err(|e| HarnessError::io(format!("writing {}", tmp.display()), e))?;
            std::fs::rename(&tmp, path)
                .map_err(|e| HarnessError::io(format!("writing {}", path.display()), e))?;
        }
        None => print!("{env}"),
    }
    eprintln!(
        "cairn-harness: up in {:.1}s; logs in {}/logs; Ctrl-C stops everything",
        started.elapsed().as_secs_f64(),
        dir.display()
    );
    let _ = std::io::stdout().flush();
    while !STOP.load(Ordering::SeqCst) {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    eprintln!("cairn-harness: stopping");
    drop(pods);
    drop(s3);
    drop(cp);
    if let Some(path) = env_file {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}
