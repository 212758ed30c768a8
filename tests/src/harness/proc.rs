//! Child processes that can never outlive the harness.
//!
//! Every component runs in its own process group with `PR_SET_PDEATHSIG = SIGKILL`, so it
//! dies with the harness even when the harness itself is killed with SIGKILL; on an orderly
//! stop the group gets SIGTERM, then SIGKILL after a grace period.
//!
//! The death signal fires when the *thread* that forked the child ends, not the process, so
//! all children are forked by one keeper thread that lives as long as the process: a cluster
//! shared by the tests of one test binary outlives the test that started it and dies with
//! the binary.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::HarnessError;

/// A running component. Stopped (its whole process group) on drop.
#[derive(Debug)]
pub struct Proc {
    pub name: String,
    pub log: PathBuf,
    child: Option<Child>,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Result<Self, HarnessError> {
        let out = File::create(log)
            .map_err(|e| HarnessError::io(format!("creating {}", log.display()), e))?;
        let err = out
            .try_clone()
            .map_err(|e| HarnessError::io("cloning a log handle", e))?;
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        // SAFETY: prctl is async-signal-safe; called between fork and exec in the child.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let program = format!("{:?}", cmd.get_program());
        let child = spawn_on_keeper(cmd)
            .map_err(|e| HarnessError::io(format!("starting {name} ({program})"), e))?;
        Ok(Self {
            name: name.to_string(),
            log: log.to_path_buf(),
            child: Some(child),
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `Err` with the log's tail when the process has exited.
    pub fn check_alive(&mut self) -> Result<(), HarnessError> {
        if let Some(child) = self.child.as_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
            return Err(HarnessError::Exited {
                name: self.name.clone(),
                status: status.to_string(),
                log_tail: tail(&self.log),
            });
        }
        Ok(())
    }

    /// SIGTERM to the process group, SIGKILL after `grace`, then reap.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pgid = child.id() as i32;
        // SAFETY: plain syscalls on a process group we created.
        unsafe {
            libc::kill(-pgid, libc::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // The group may hold grandchildren even when the leader is gone.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(3));
    }
}

/// Last lines of a log file, for error messages.
pub fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// A loopback port that was free a moment ago, never handed out twice in this process: tests
/// run at once, and a port one of them has let go of (its server stopped, or "down" on
/// purpose) would otherwise reach another test's server, which then answers for the wrong one.
pub fn free_port() -> Result<u16, HarnessError> {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| HarnessError::io("finding a free port", e))?;
        if !given.contains(&port) {
            given.push(port);
            return Ok(port);
        }
    }
}

/// Polls `probe` until it returns true or `timeout` passes; checks that `procs` stay alive.
pub fn wait_until(
    what: &str,
    timeout: Duration,
    procs: &mut [&mut Proc],
    mut probe: impl FnMut() -> bool,
) -> Result<(), HarnessError> {
    let deadline = Instant::now() + timeout;
    loop {
        if probe() {
            return Ok(());
        }
        for p in procs.iter_mut() {
            p.check_alive()?;
        }
        if Instant::now() >= deadline {
            let logs = procs
                .iter()
                .map(|p| format!("--- {} ({})\n{}", p.name, p.log.display(), tail(&p.log)))
                .collect::<Vec<_>>()
                .join("\n");
            return Err(HarnessError::Timeout {
                what: what.to_string(),
                after: timeout,
                logs,
            });
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Forks `cmd` on the keeper thread (see the module documentation).
fn spawn_on_keeper(cmd: Command) -> std::io::Result<Child> {
    static KEEPER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let keeper = KEEPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("harness-keeper".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
                // Never return: returning would fire the death signal of every child.
                loop {
                    std::thread::park();
                }
            })
            .map(|_| ())
            .unwrap_or(());
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    keeper
        .lock()
        .map_err(|_| std::io::Error::other("harness keeper lock poisoned"))?
        .send((cmd, reply_tx))
        .map_err(|_| std::io::Error::other("harness keeper thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| std::io::Error::other("harness keeper thread is gone"))?
}
