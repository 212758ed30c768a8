//! A process runtime for pods: kwok marks pods Running without running anything, so for
//! every Running pod that matches a selector the runtime starts the pod's container as a
//! local process, the way a kubelet would:
//!
//! - the program is the container's `command[0]` when it has one, else the binary the image
//!   maps to (`ImageMap`, e.g. `ghcr.io/cairn-dev/cairn-agent` → `target/debug/cairn-agent`);
//! - arguments are the container's; listen addresses (`--listen`, `--metrics-addr`, in both
//!   `--flag=value` and `--flag value` forms, also `--metrics-listen`) become `127.0.0.1:<free port>`, reported per pod;
//! - environment: literal values, `secretKeyRef` and `configMapKeyRef` values read from the
//!   API (as the kubelet does), `fieldRef` for the pod's name, namespace and IP;
//! - identity: a token for the pod's own ServiceAccount from the TokenRequest API, bound to
//!   the pod, in a kubeconfig passed as `KUBECONFIG` — so the process has exactly the pod's
//!   RBAC;
//! - volumes: each `volumeMount` gets a per-pod directory, and env values under a mount path
//!   are rewritten to it (there is no chroot here);
//! - the process stops when the pod is deleted or stops being Running.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use super::HarnessError;
use super::controlplane::ControlPlane;
use super::proc::{Proc, free_port};

/// Image name (without tag) → local binary.
pub type ImageMap = BTreeMap<String, PathBuf>;

/// What the runtime knows about one started pod.
#[derive(Debug, Clone)]
pub struct RunningPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub pid: u32,
    /// Rewritten listen flags: flag name (`listen`, `metrics-addr`) → local port.
    pub ports: BTreeMap<String, u16>,
    pub log: PathBuf,
    pub root: PathBuf,
}

struct Inner {
    pods: BTreeMap<String, (RunningPod, Proc)>,
    errors: Vec<String>,
}

/// The runtime; stops every process it started when dropped.
pub struct PodRuntime {
    inner: Arc<Mutex<Inner>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Flags whose value is a listen address to rewrite to a free local port.
const LISTEN_FLAGS: [&str; 3] = ["listen", "metrics-addr", "metrics-listen"];

struct Ctx {
    kubectl: PathBuf,
    kubeconfig: PathBuf,
    server: String,
    ca: PathBuf,
    dir: PathBuf,
    images: ImageMap,
    selector: String,
}

impl PodRuntime {
    /// Starts watching pods matching `selector` (a label selector, may be empty).
    pub fn start(
        cp: &ControlPlane,
        images: ImageMap,
        selector: &str,
    ) -> Result<Self, HarnessError> {
        let dir = cp.dir.join("pods");
        std::fs::create_dir_all(&dir)
            .map_err(|e| HarnessError::io("creating the pod runtime directory", e))?;
        let ctx = Ctx {
            kubectl: cp.kubectl.clone(),
            kubeconfig: cp.kubeconfig.clone(),
            server: cp.server.clone(),
            ca: cp.pki.ca_crt(),
            dir,
            images,
            selector: selector.to_string(),
        };
        let inner = Arc::new(Mutex::new(Inner {
            pods: BTreeMap::new(),
            errors: Vec::new(),
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (inner, stop) = (inner.clone(), stop.clone());
            std::thread::Builder::new()
                .name("pod-runtime".into())
                .spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        if let Err(e) = sync_once(&ctx, &inner)
                            && let Ok(mut i) = inner.lock()
                        {
                            i.errors.push(e.to_string());
                        }
                        write_state(&ctx.dir.join("pods.json"), &inner);
                        std::thread::sleep(Duration::from_millis(300));
                    }
                })
                .map_err(|e| HarnessError::io("starting the pod runtime thread", e))?
        };
        Ok(Self {
            inner,
            stop,
            thread: Some(thread),
        })
    }

    /// The started pods.
    pub fn pods(&self) -> Vec<RunningPod> {
        self.inner
            .lock()
            .map(|i| i.pods.values().map(|(p, _)| p.clone()).collect())
            .unwrap_or_default()
    }

    /// The pod `namespace/name`, once its process runs.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<RunningPod> {
        self.pods()
            .into_iter()
            .find(|p| p.namespace == namespace && p.name == name)
    }

    /// Waits up to `timeout` for the process of `namespace/name`.
    pub fn wait_for(
        &self,
        namespace: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<RunningPod, HarnessError> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(p) = self.pod(namespace, name) {
                return Ok(p);
            }
            if std::time::Instant::now() >= deadline {
                return Err(HarnessError::Timeout {
                    what: format!("a process for pod {namespace}/{name}"),
                    after: timeout,
                    logs: self.errors().join("\n"),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Problems met while starting pods (bad specs, missing images).
    pub fn errors(&self) -> Vec<String> {
        self.inner
            .lock()
            .map(|i| i.errors.clone())
            .unwrap_or_default()
    }
}

impl Drop for PodRuntime {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Ok(mut i) = self.inner.lock() {
            for (_, (_, mut proc)) in std::mem::take(&mut i.pods) {
                proc.stop(Duration::from_secs(5));
            }
        }
    }
}

/// `pods.json` in the runtime directory: what runs where, for people and scripts
/// (`cairn-harness up` points to it). Written atomically.
fn write_state(path: &Path, inner: &Mutex<Inner>) {
    let Ok(i) = inner.lock() else { return };
    let pods: Vec<Value> = i
        .pods
        .values()
        .map(|(p, _)| {
            serde_json::json!({
                "namespace": p.namespace, "name": p.name, "uid": p.uid, "pid": p.pid,
                "ports": p.ports, "log": p.log, "root": p.root,
            })
        })
        .collect();
    let doc = serde_json::json!({"pods": pods, "errors": i.errors});
    drop(i);
    let tmp = path.with_extension("tmp");
    if std::fs::write(&tmp, doc.to_string()).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

fn kubectl_json(ctx: &Ctx, args: &[&str]) -> Result<Value, HarnessError> {
    let out = Command::new(&ctx.kubectl)
        .arg(format!("--kubeconfig={}", ctx.kubeconfig.display()))
        .args(args)
        .output()
        .map_err(|e| HarnessError::io("running kubectl", e))?;
    if !out.status.success() {
        return Err(HarnessError::Kubectl {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    serde_json::from_slice(&out.stdout)
        .map_err(|e| HarnessError::Setup(format!("kubectl {} gave bad JSON: {e}", args.join(" "))))
}

fn sync_once(ctx: &Ctx, inner: &Mutex<Inner>) -> Result<(), HarnessError> {
    let mut args = vec!["get", "pods", "--all-namespaces", "-o", "json"];
    if !ctx.selector.is_empty() {
        args.extend(["-l", ctx.selector.as_str()]);
    }
    let list = kubectl_json(ctx, &args)?;
    let mut running: BTreeMap<String, &Value> = BTreeMap::new();
    for pod in list["items"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let is_running =
            pod["status"]["phase"] == "Running" && pod["metadata"]["deletionTimestamp"].is_null();
        if let Some(uid) = pod["metadata"]["uid"].as_str()
            && is_running
        {
            running.insert(uid.to_string(), pod);
        }
    }
    // Stop processes of pods that are gone or no longer running.
    let gone: Vec<(RunningPod, Proc)> = {
        let mut i = inner
            .lock()
            .map_err(|_| HarnessError::Setup("pod runtime lock poisoned".into()))?;
        let uids: Vec<String> = i
            .pods
            .keys()
            .filter(|u| !running.contains_key(*u))
            .cloned()
            .collect();
        uids.into_iter().filter_map(|u| i.pods.remove(&u)).collect()
    };
    for (_, mut proc) in gone {
        proc.stop(Duration::from_secs(5));
    }
    // Start processes for new running pods.
    for (uid, pod) in running {
        let known = inner
            .lock()
            .map(|i| i.pods.contains_key(&uid))
            .unwrap_or(true);
        if known {
            continue;
        }
        match start_pod(ctx, pod) {
            Ok(started) => {
                if let Ok(mut i) = inner.lock() {
                    i.pods.insert(uid, started);
                }
            }
            Err(e) => {
                if let Ok(mut i) = inner.lock() {
                    let msg = format!(
                        "pod {}/{}: {e}",
                        pod["metadata"]["namespace"], pod["metadata"]["name"]
                    );
                    if !i.errors.contains(&msg) {
                        i.errors.push(msg);
                    }
                }
            }
        }
    }
    Ok(())
}

fn start_pod(ctx: &Ctx, pod: &Value) -> Result<(RunningPod, Proc), HarnessError> {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let namespace = s(&pod["metadata"]["namespace"]);
    let name = s(&pod["metadata"]["name"]);
    let uid = s(&pod["metadata"]["uid"]);
    let container = &pod["spec"]["containers"][0];
    let root = ctx
        .dir
        .join(format!("{namespace}_{name}_{}", &uid[..uid.len().min(8)]));
    std::fs::create_dir_all(&root).map_err(|e| HarnessError::io("creating a pod directory", e))?;

    // Program and arguments. An image cairn knows maps to a local binary: it replaces the
    // image's entrypoint, and a `command` naming that binary (`cairn-agent`) too.
    let image = s(&container["image"]);
    let mapped = ctx.images.get(image_repository(&image));
    let mut argv: Vec<String> = container["command"]
        .as_array()
        .map(|a| a.iter().map(s).collect())
        .unwrap_or_default();
    match (mapped, argv.first()) {
        (Some(bin), Some(cmd))
            if bin
                .file_name()
                .is_some_and(|f| Path::new(cmd).file_name() == Some(f)) =>
        {
            argv[0] = bin.to_string_lossy().into_owned();
        }
        (Some(bin), None) => argv.push(bin.to_string_lossy().into_owned()),
        (None, None) => {
            return Err(HarnessError::Setup(format!(
                "no local binary for image {image} (known: {:?})",
                ctx.images.keys()
            )));
        }
        _ => {}
    }
    argv.extend(
        container["args"]
            .as_array()
            .map(|a| a.iter().map(s).collect::<Vec<_>>())
            .unwrap_or_default(),
    );
    let (argv, ports) = rewrite_listen_flags(argv)?;

    // Volumes: one directory per mount; ConfigMap and Secret volumes are filled with their
    // keys (or their `items`) as files, as the kubelet does.
    for v in pod["spec"]["volumes"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let (kind, source, b64) = if let Some(src) = v.get("configMap") {
            ("configmap", src, false)
        } else if let Some(src) = v.get("secret") {
            ("secret", src, true)
        } else {
            continue;
        };
        let obj_name = s(source
            .get("name")
            .or_else(|| source.get("secretName"))
            .unwrap_or(&Value::Null));
        let dir = root.join("volumes").join(s(&v["name"]));
        std::fs::create_dir_all(&dir)
            .map_err(|e| HarnessError::io("creating a volume directory", e))?;
        let items: Vec<(String, String)> = match source["items"].as_array() {
            Some(items) => items
                .iter()
                .map(|i| (s(&i["key"]), s(&i["path"])))
                .collect(),
            None => {
                let obj = kubectl_json(
                    ctx,
                    &["get", kind, &obj_name, "-n", &namespace, "-o", "json"],
                )?;
                obj["data"]
                    .as_object()
                    .map(|m| m.keys().map(|k| (k.clone(), k.clone())).collect())
                    .unwrap_or_default()
            }
        };
        for (key, path) in items {
            if path.contains("..") {
                continue;
            }
            let value = read_key(ctx, kind, &namespace, &obj_name, &key, b64)?;
            std::fs::write(dir.join(&path), value)
                .map_err(|e| HarnessError::io("writing a volume file", e))?;
        }
    }
    let mut mounts: Vec<(String, PathBuf)> = Vec::new();
    for m in container["volumeMounts"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let mut dir = root.join("volumes").join(s(&m["name"]));
        if let Some(sub) = m["subPath"]
            .as_str()
            .filter(|p| !p.is_empty() && !p.contains(".."))
        {
            dir = dir.join(sub);
        }
        std::fs::create_dir_all(&dir)
            .map_err(|e| HarnessError::io("creating a volume directory", e))?;
        mounts.push((s(&m["mountPath"]), dir));
    }
    let remap = |value: String| -> String {
        for (mount, dir) in &mounts {
            if let Some(rest) = value.strip_prefix(mount.as_str())
                && (rest.is_empty() || rest.starts_with('/'))
            {
                return format!("{}{rest}", dir.display());
            }
        }
        value
    };

    // Environment.
    let mut env: Vec<(String, String)> = Vec::new();
    for e in container["env"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let key = s(&e["name"]);
        let value = if let Some(v) = e["value"].as_str() {
            v.to_string()
        } else if let Some(r) = e["valueFrom"].get("secretKeyRef") {
            match read_key(
                ctx,
                "secret",
                &namespace,
                &s(&r["name"]),
                &s(&r["key"]),
                true,
            ) {
                Ok(v) => v,
                Err(_) if r["optional"] == true => continue,
                Err(err) => return Err(err),
            }
        } else if let Some(r) = e["valueFrom"].get("configMapKeyRef") {
            match read_key(
                ctx,
                "configmap",
                &namespace,
                &s(&r["name"]),
                &s(&r["key"]),
                false,
            ) {
                Ok(v) => v,
                Err(_) if r["optional"] == true => continue,
                Err(err) => return Err(err),
            }
        } else if let Some(f) = e["valueFrom"].get("fieldRef") {
            match f["fieldPath"].as_str().unwrap_or_default() {
                "metadata.name" => name.clone(),
                "metadata.namespace" => namespace.clone(),
                "metadata.uid" => uid.clone(),
                "status.podIP" | "status.hostIP" => "127.0.0.1".into(),
                "spec.serviceAccountName" => s(&pod["spec"]["serviceAccountName"]),
                other => return Err(HarnessError::Setup(format!("unsupported fieldRef {other}"))),
            }
        } else {
            String::new()
        };
        env.push((key, remap(value)));
    }

    // Identity: a token for the pod's ServiceAccount, bound to the pod.
    let sa = pod["spec"]["serviceAccountName"]
        .as_str()
        .unwrap_or("default");
    let token = {
        let out = Command::new(&ctx.kubectl)
            .arg(format!("--kubeconfig={}", ctx.kubeconfig.display()))
            .args([
                "create",
                "token",
                sa,
                "-n",
                &namespace,
                "--bound-object-kind=Pod",
                &format!("--bound-object-name={name}"),
                "--duration=24h",
            ])
            .output()
            .map_err(|e| HarnessError::io("running kubectl create token", e))?;
        if !out.status.success() {
            return Err(HarnessError::Kubectl {
                args: format!("create token {sa}"),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let kubeconfig = root.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: pod\n  user:\n    token: {token}\ncontexts:\n- name: pod\n  context:\n    cluster: c\n    user: pod\n    namespace: {namespace}\ncurrent-context: pod\n",
            ctx.server,
            ctx.ca.display()
        ),
    )
    .map_err(|e| HarnessError::io("writing a pod kubeconfig", e))?;

    let Some((program, rest)) = argv.split_first() else {
        return Err(HarnessError::Setup("container has no command".into()));
    };
    let mut cmd = Command::new(program);
    cmd.args(rest).env_clear().current_dir(&root);
    for key in ["PATH", "RUST_BACKTRACE", "LANG"] {
        if let Some(v) = std::env::var_os(key) {
            cmd.env(key, v);
        }
    }
    cmd.env("HOME", &root)
        .env("TMPDIR", root.join("tmp"))
        .env("KUBECONFIG", &kubeconfig)
        .env("HOSTNAME", &name)
        .envs(env);
    std::fs::create_dir_all(root.join("tmp"))
        .map_err(|e| HarnessError::io("creating a pod tmp dir", e))?;
    let log = root.join("container.log");
    let proc = Proc::spawn(&format!("pod {namespace}/{name}"), cmd, &log)?;
    let running = RunningPod {
        namespace,
        name,
        uid,
        pid: proc.pid().unwrap_or_default(),
        ports,
        log,
        root,
    };
    Ok((running, proc))
}

/// `ghcr.io/x/y:tag` / `ghcr.io/x/y@sha256:...` → `ghcr.io/x/y`.
fn image_repository(image: &str) -> &str {
    let no_digest = image.split('@').next().unwrap_or(image);
    match no_digest.rfind(':') {
        Some(i) if !no_digest[i..].contains('/') => &no_digest[..i],
        _ => no_digest,
    }
}

/// Rewrites listen flags to free loopback ports; returns the new argv and the ports.
fn rewrite_listen_flags(
    argv: Vec<String>,
) -> Result<(Vec<String>, BTreeMap<String, u16>), HarnessError> {
    let mut out = Vec::with_capacity(argv.len());
    let mut ports = BTreeMap::new();
    let mut iter = argv.into_iter();
    while let Some(arg) = iter.next() {
        let flag = LISTEN_FLAGS
            .iter()
            .find(|f| arg == format!("--{f}") || arg.starts_with(&format!("--{f}=")));
        match flag {
            Some(f) => {
                let port = free_port()?;
                ports.insert(f.to_string(), port);
                if !arg.contains('=') {
                    iter.next();
                }
                out.push(format!("--{f}=127.0.0.1:{port}"));
            }
            None => out.push(arg),
        }
    }
    Ok((out, ports))
}

fn read_key(
    ctx: &Ctx,
    kind: &str,
    namespace: &str,
    name: &str,
    key: &str,
    base64: bool,
) -> Result<String, HarnessError> {
    let obj = kubectl_json(ctx, &["get", kind, name, "-n", namespace, "-o", "json"])?;
    let raw = obj["data"][key].as_str().ok_or_else(|| {
        HarnessError::Setup(format!("{kind} {namespace}/{name} has no key {key}"))
    })?;
    if !base64 {
        return Ok(raw.to_string());
    }
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(raw)
        .map_err(|e| {
            HarnessError::Setup(format!(
                "{kind} {namespace}/{name} key {key} is not base64: {e}"
            ))
        })?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The standard image map: cairn's images → binaries in the Cargo target directory.
pub fn cairn_images(target_dir: &Path) -> ImageMap {
    let mut m = ImageMap::new();
    m.insert(
        "ghcr.io/cairn-dev/cairn-agent".into(),
        target_dir.join("cairn-agent"),
    );
    m.insert(
        "ghcr.io/cairn-dev/cairn-operator".into(),
        target_dir.join("cairn-operator"),
    );
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_repository_strips_tag_and_digest() {
        assert_eq!(image_repository("ghcr.io/a/b:1.2"), "ghcr.io/a/b");
        assert_eq!(image_repository("localhost:5000/a/b"), "localhost:5000/a/b");
        assert_eq!(
            image_repository("localhost:5000/a/b:v1"),
            "localhost:5000/a/b"
        );
        assert_eq!(image_repository("a/b@sha256:abc"), "a/b");
    }

    #[test]
    fn listen_flags_are_rewritten_in_both_forms() {
        let (argv, ports) = rewrite_listen_flags(
            [
                "x",
                "serve",
                "--listen",
                "0.0.0.0:8080",
                "--metrics-addr=0.0.0.0:9090",
                "--session",
                "a/b",
            ]
            .map(String::from)
            .to_vec(),
        )
        .expect("ports");
        assert_eq!(argv.len(), 6);
        assert_eq!(argv[2], format!("--listen=127.0.0.1:{}", ports["listen"]));
        assert_eq!(
            argv[3],
            format!("--metrics-addr=127.0.0.1:{}", ports["metrics-addr"])
        );
        assert_eq!(&argv[4..], ["--session", "a/b"]);
    }
}
