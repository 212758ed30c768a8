//! A real Kubernetes control plane on loopback: etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler and kwok (fake nodes whose pods kwok marks
//! Running), built from Go modules by `tests/harness/build-control-plane.sh` and cached.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use super::pki::Pki;
use super::proc::{Proc, free_port, wait_until};
use super::{HarnessError, built_paths};

/// Paths of the control-plane binaries.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub etcd: PathBuf,
    /// kwok's lifecycle stages (YAML), extracted from its module.
    pub kwok_stages: PathBuf,
    pub kwok: PathBuf,
    pub kube_apiserver: PathBuf,
    pub kube_controller_manager: PathBuf,
    pub kube_scheduler: PathBuf,
    pub kubectl: PathBuf,
}

impl Binaries {
    /// Builds what is missing (first run: minutes) and returns the cached paths.
    pub fn ensure() -> Result<Self, HarnessError> {
        let built = built_paths("build-control-plane.sh")?;
        let get = |k: &str| built.get(k);
        Ok(Self {
            etcd: get("etcd")?,
            kwok_stages: get("kwok-stages")?,
            kwok: get("kwok")?,
            kube_apiserver: get("kube-apiserver")?,
            kube_controller_manager: get("kube-controller-manager")?,
            kube_scheduler: get("kube-scheduler")?,
            kubectl: get("kubectl")?,
        })
    }
}

/// Name of the fake node every cluster gets.
pub const NODE_NAME: &str = "kwok-node-0";

/// A running control plane. Everything stops when it is dropped.
pub struct ControlPlane {
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub server: String,
    pub pki: Pki,
    /// kubectl of the same version as the API server.
    pub kubectl: PathBuf,
    /// etcd's client URL (`http://127.0.0.1:PORT`), for tests that look at how the API server
    /// stores an object (`etcd_value`).
    pub etcd: String,
    // Stopped in reverse start order by `Drop` of the Vec (drop order is front to back,
    // so `stop` handles the order explicitly).
    procs: Vec<Proc>,
}

impl ControlPlane {
    /// Starts every component in `dir` (created; reused files are overwritten) and waits
    /// until the API server is ready, the default ServiceAccount exists and the fake node is
    /// Ready.
    pub fn start(dir: &Path) -> Result<Self, HarnessError> {
        let bins = Binaries::ensure()?;
        std::fs::create_dir_all(dir)
            .map_err(|e| HarnessError::io(format!("creating {}", dir.display()), e))?;
        let pki = Pki::create(&dir.join("pki"))?;
        let logs = dir.join("logs");
        std::fs::create_dir_all(&logs)
            .map_err(|e| HarnessError::io("creating the log directory", e))?;
        let s = |p: &Path| p.to_string_lossy().into_owned();

        let etcd_port = free_port()?;
        let peer_port = free_port()?;
        let api_port = free_port()?;
        let server = format!("https://127.0.0.1:{api_port}");
        let kubeconfig = dir.join("kubeconfig");
        write_kubeconfig(&kubeconfig, &server, &pki)?;

        let mut etcd = Command::new(&bins.etcd);
        etcd.args([
            "--name=harness",
            &format!("--data-dir={}", s(&dir.join("etcd"))),
            &format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"),
            &format!("--advertise-client-urls=http://127.0.0.1:{etcd_port}"),
            &format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
            &format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
            &format!("--initial-cluster=harness=http://127.0.0.1:{peer_port}"),
            "--unsafe-no-fsync=true",
            "--log-level=warn",
            "--quota-backend-bytes=4294967296",
        ]);
        let mut procs = vec![Proc::spawn("etcd", etcd, &logs.join("etcd.log"))?];

        let mut api = Command::new(&bins.kube_apiserver);
        api.args([
            &format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            // Loopback is refused by the endpoint reconciler; in-cluster clients do not exist here.
            "--endpoint-reconciler-type=none",
            &format!("--secure-port={api_port}"),
            &format!("--cert-dir={}", s(&dir.join("pki"))),
            &format!("--tls-cert-file={}", s(&pki.apiserver_crt())),
            &format!("--tls-private-key-file={}", s(&pki.apiserver_key())),
            &format!("--client-ca-file={}", s(&pki.ca_crt())),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            &format!("--service-account-key-file={}", s(&pki.sa_pub())),
            &format!("--service-account-signing-key-file={}", s(&pki.sa_key())),
            "--service-cluster-ip-range=10.96.0.0/16",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            // A real node's name does not resolve: logs and exec go to its InternalIP.
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--enable-priority-and-fairness=false",
            "--v=1",
        ]);
        // `/debug/pprof` for measuring the API server itself (the scale runs); off otherwise.
        api.arg(format!("--profiling={}", profiling()));
        procs.push(Proc::spawn(
            "kube-apiserver",
            api,
            &logs.join("kube-apiserver.log"),
        )?);

        let mut cp = Self {
            dir: dir.to_path_buf(),
            kubeconfig,
            server,
            pki,
            kubectl: bins.kubectl.clone(),
            etcd: format!("http://127.0.0.1:{etcd_port}"),
            procs,
        };
        {
            let (k, kc) = (cp.kubectl.clone(), cp.kubeconfig.clone());
            let mut refs: Vec<&mut Proc> = cp.procs.iter_mut().collect();
            wait_until(
                "kube-apiserver /readyz",
                Duration::from_secs(90),
                &mut refs,
                || {
                    kubectl_output(&k, &kc, &["get", "--raw", "/readyz"])
                        .is_ok_and(|o| o.status.success())
                },
            )?;
        }

        let mut kcm = Command::new(&bins.kube_controller_manager);
        kcm.args([
            &format!("--kubeconfig={}", s(&cp.kubeconfig)),
            &format!("--authentication-kubeconfig={}", s(&cp.kubeconfig)),
            &format!("--authorization-kubeconfig={}", s(&cp.kubeconfig)),
            &format!("--service-account-private-key-file={}", s(&cp.pki.sa_key())),
            &format!("--root-ca-file={}", s(&cp.pki.ca_crt())),
            &format!("--cluster-signing-cert-file={}", s(&cp.pki.ca_crt())),
            &format!("--cluster-signing-key-file={}", s(&cp.pki.ca_key())),
            "--use-service-account-credentials=true",
            "--leader-elect=false",
            // No HTTPS endpoint (nothing here reads it): a port picked free and bound later
            // can be taken in between by another test's process.
            "--secure-port=0",
            "--controllers=*,-node-ipam-controller",
            "--concurrent-statefulset-syncs=20",
            "--concurrent-gc-syncs=40",
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            "--v=1",
        ]);
        cp.procs.push(Proc::spawn(
            "kube-controller-manager",
            kcm,
            &logs.join("kube-controller-manager.log"),
        )?);

        let mut sched = Command::new(&bins.kube_scheduler);
        sched.args([
            &format!("--kubeconfig={}", s(&cp.kubeconfig)),
            &format!("--authentication-kubeconfig={}", s(&cp.kubeconfig)),
            &format!("--authorization-kubeconfig={}", s(&cp.kubeconfig)),
            "--leader-elect=false",
            // As the controller-manager's: no HTTPS endpoint, no port to lose to a race.
            "--secure-port=0",
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            "--v=1",
        ]);
        cp.procs.push(Proc::spawn(
            "kube-scheduler",
            sched,
            &logs.join("kube-scheduler.log"),
        )?);

        cp.apply_yaml(&fake_node_yaml())?;
        let mut kwok = Command::new(&bins.kwok);
        kwok.args([
            &format!("--kubeconfig={}", s(&cp.kubeconfig)),
            &format!("--config={}", s(&bins.kwok_stages)),
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            "--node-ip=127.0.0.1",
            "--cidr=10.244.0.0/16",
            &format!("--server-address=127.0.0.1:{}", free_port()?),
        ]);
        cp.procs
            .push(Proc::spawn("kwok", kwok, &logs.join("kwok.log"))?);

        let (k, kc) = (cp.kubectl.clone(), cp.kubeconfig.clone());
        let mut refs: Vec<&mut Proc> = cp.procs.iter_mut().collect();
        wait_until(
            "the default ServiceAccount (controller-manager up)",
            Duration::from_secs(90),
            &mut refs,
            || {
                kubectl_output(
                    &k,
                    &kc,
                    &["get", "serviceaccount", "default", "-n", "default"],
                )
                .is_ok_and(|o| o.status.success())
            },
        )?;
        wait_until(
            "the fake node to be Ready (kwok up)",
            Duration::from_secs(60),
            &mut refs,
            || {
                kubectl_output(
                    &k,
                    &kc,
                    &[
                        "get",
                        "node",
                        NODE_NAME,
                        "-o",
                        "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                    ],
                )
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "True")
            },
        )?;
        Ok(cp)
    }

    /// `kubectl` against this cluster as cluster-admin.
    pub fn kubectl(&self, args: &[&str]) -> Result<Output, HarnessError> {
        kubectl_output(&self.kubectl, &self.kubeconfig, args)
    }

    /// `kubectl` that must succeed; returns stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> Result<String, HarnessError> {
        let out = self.kubectl(args)?;
        if !out.status.success() {
            return Err(HarnessError::Kubectl {
                args: args.join(" "),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `kubectl apply --server-side -f -` with `yaml` on stdin.
    pub fn apply_yaml(&self, yaml: &str) -> Result<String, HarnessError> {
        kubectl_stdin(
            &self.kubectl,
            &self.kubeconfig,
            &["apply", "--server-side", "--force-conflicts", "-f", "-"],
            yaml,
        )
    }

    /// Applies cairn's CRDs and waits until the API server serves them: a create sent right
    /// after the apply can otherwise get a 404 while the new resources are being registered.
    pub fn install_crds(&self) -> Result<(), HarnessError> {
        let yaml = cairn_crds::crds_yaml().map_err(|e| HarnessError::Setup(e.to_string()))?;
        self.apply_yaml(&yaml)?;
        kubectl_stdin(
            &self.kubectl,
            &self.kubeconfig,
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "-f",
                "-",
            ],
            &yaml,
        )?;
        Ok(())
    }

    /// `kubectl <args> -f -` with `yaml` on stdin, returning the whole output even on failure.
    pub fn kubectl_with_stdin(&self, args: &[&str], yaml: &str) -> Result<Output, HarnessError> {
        kubectl_stdin_output(&self.kubectl, &self.kubeconfig, args, yaml)
    }

    /// The bytes etcd holds under `key`, or `None`: how the API server stored an object, which
    /// no API request shows (it converts on the way out). A custom resource is JSON under
    /// `/registry/<group>/<plural>/<namespace>/<name>`, its `apiVersion` the version it was
    /// encoded in. Through etcd's JSON gateway (`/v3/kv/range`).
    pub async fn etcd_value(&self, key: &str) -> Result<Option<Vec<u8>>, HarnessError> {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let failed = |e: &dyn std::fmt::Display| HarnessError::Setup(format!("etcd {key}: {e}"));
        let reply: serde_json::Value = reqwest::Client::new()
            .post(format!("{}/v3/kv/range", self.etcd))
            .json(&serde_json::json!({"key": b64.encode(key)}))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| failed(&e))?
            .json()
            .await
            .map_err(|e| failed(&e))?;
        match reply["kvs"][0]["value"].as_str() {
            Some(value) => b64.decode(value).map(Some).map_err(|e| failed(&e)),
            None => Ok(None),
        }
    }

    /// PIDs of every component (for leak checks).
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.procs
            .iter()
            .filter_map(|p| p.pid().map(|pid| (p.name.clone(), pid)))
            .collect()
    }

    /// Stops every component, newest first.
    pub fn stop(&mut self) {
        while let Some(mut p) = self.procs.pop() {
            p.stop(Duration::from_secs(5));
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether the API server serves `/debug/pprof`: `CAIRN_HARNESS_PROFILING=1` (for profiling the
/// control plane in the scale runs; see docs/benchmarks.md).
fn profiling() -> bool {
    std::env::var("CAIRN_HARNESS_PROFILING").is_ok_and(|v| v == "1")
}

fn write_kubeconfig(path: &Path, server: &str, pki: &Pki) -> Result<(), HarnessError> {
    let s = |p: PathBuf| p.to_string_lossy().into_owned();
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: harness\n  cluster:\n    server: {server}\n    certificate-authority: {}\n\
users:\n- name: admin\n  user:\n    client-certificate: {}\n    client-key: {}\n\
contexts:\n- name: harness\n  context:\n    cluster: harness\n    user: admin\n    namespace: default\ncurrent-context: harness\n",
        s(pki.ca_crt()),
        s(pki.admin_crt()),
        s(pki.admin_key())
    );
    std::fs::write(path, text).map_err(|e| HarnessError::io("writing the kubeconfig", e))
}

fn fake_node_yaml() -> String {
    format!(
        r#"apiVersion: v1
kind: Node
metadata:
  name: {NODE_NAME}
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    kubernetes.io/hostname: {NODE_NAME}
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
spec: {{}}
status:
  allocatable: {{cpu: "4000", memory: 16000Gi, pods: "20000"}}
  capacity: {{cpu: "4000", memory: 16000Gi, pods: "20000"}}
  nodeInfo:
    architecture: amd64
    operatingSystem: linux
    kubeletVersion: fake
"#
    )
}

/// kubectl's discovery cache beside the kubeconfig, one per cluster. The default one is per
/// host and port, and a port a finished control plane used comes back for a later one: an
/// API server that serves other versions of cairn's resources (an upgrade test's earlier
/// CRDs) would then be asked for the old ones, and answer 404 for hours.
fn cache_dir(kubeconfig: &Path) -> String {
    format!(
        "--cache-dir={}",
        kubeconfig.with_file_name("kube-cache").display()
    )
}

pub(crate) fn kubectl_output(
    kubectl: &Path,
    kubeconfig: &Path,
    args: &[&str],
) -> Result<Output, HarnessError> {
    Command::new(kubectl)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(cache_dir(kubeconfig))
        .arg("--request-timeout=30s")
        .args(args)
        .output()
        .map_err(|e| HarnessError::io("running kubectl", e))
}

fn kubectl_stdin_output(
    kubectl: &Path,
    kubeconfig: &Path,
    args: &[&str],
    input: &str,
) -> Result<Output, HarnessError> {
    use std::io::Write;
    let mut child = Command::new(kubectl)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(cache_dir(kubeconfig))
        .arg("--request-timeout=30s")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| HarnessError::io("running kubectl", e))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .map_err(|e| HarnessError::io("writing to kubectl", e))?;
    }
    child
        .wait_with_output()
        .map_err(|e| HarnessError::io("waiting for kubectl", e))
}

fn kubectl_stdin(
    kubectl: &Path,
    kubeconfig: &Path,
    args: &[&str],
    input: &str,
) -> Result<String, HarnessError> {
    let out = kubectl_stdin_output(kubectl, kubeconfig, args, input)?;
    if !out.status.success() {
        return Err(HarnessError::Kubectl {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
