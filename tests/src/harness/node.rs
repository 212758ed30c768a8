//! A real Kubernetes node beside the control plane: containerd and runc run the pods,
//! the kubelet registers against the harness's API server, kube-proxy routes Services and
//! kube-router (firewall only) enforces NetworkPolicy. Built from Go modules by
//! `tests/harness/build-node.sh` and cached.
//!
//! The node lives in namespaces of its own, so it cannot touch the machine and leaves
//! nothing behind:
//! - a network namespace, joined to the host by a veth on a private /24
//!   (`10.250.N.0/24`: host `.1`, node `.2`); pods get `10.251.N.0/24` on a bridge inside
//!   it. The node has no default route: pods reach only the node, each other and Services.
//!   The API server stays on the host's loopback; a forwarder listens on `:6443` inside the
//!   node's namespace (the kubelet uses `127.0.0.1:6443`, pods the `kubernetes` Service,
//!   whose endpoint is `API_ENDPOINT_IP`, an address on every node's loopback).
//! - a mount namespace (propagation slave: nothing mounted inside leaks out) with a private
//!   `/run`, this namespace's `/sys`, and the three sysctls the kubelet would otherwise set
//!   machine-wide bound to files holding the values it wants.
//! - a PID namespace whose first process is `tests/harness/node.sh`: when the harness stops
//!   the node, or dies (`unshare --kill-child=SIGTERM` under a parent-death signal), it kills
//!   every process in the namespace and removes the node's cgroups. Iptables rules die with
//!   the network namespace, mounts with the mount namespace.

use std::fs::File;
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::controlplane::{ControlPlane, kubectl_output};
use super::proc::{Proc, tail, wait_until};
use super::{HarnessError, built_paths, built_paths_with, repo_root};

/// The image every pod sandbox runs (built locally by `build-images.sh`, pinned).
pub const PAUSE_IMAGE: &str = "harness.local/pause:cairn";
/// The port of the API server forwarder inside the node's network namespace.
pub const API_PORT: u16 = 6443;
/// Where pods reach the API server: an address on every node's own loopback (each node has
/// its own network namespace), so the `kubernetes` Service has one endpoint that is local
/// wherever the pod runs, whichever nodes come and go.
pub const API_ENDPOINT_IP: Ipv4Addr = Ipv4Addr::new(10, 249, 0, 1);
/// The Service range of the harness's API server (10.96.0.0/16).
pub const SERVICE_CIDR: &str = "10.96.0.0/16";

/// Paths of the node binaries.
#[derive(Debug, Clone)]
pub struct NodeBinaries {
    pub kubelet: PathBuf,
    pub kube_proxy: PathBuf,
    pub containerd: PathBuf,
    pub containerd_shim: PathBuf,
    pub ctr: PathBuf,
    pub runc: PathBuf,
    pub cni_bin_dir: PathBuf,
    pub kube_router: PathBuf,
}

impl NodeBinaries {
    /// Builds what is missing (first run: minutes) and returns the cached paths.
    pub fn ensure() -> Result<Self, HarnessError> {
        let b = built_paths("build-node.sh")?;
        Ok(Self {
            kubelet: b.get("kubelet")?,
            kube_proxy: b.get("kube-proxy")?,
            containerd: b.get("containerd")?,
            containerd_shim: b.get("containerd-shim-runc-v2")?,
            ctr: b.get("ctr")?,
            runc: b.get("runc")?,
            cni_bin_dir: b.get("cni-bin-dir")?,
            kube_router: b.get("kube-router")?,
        })
    }
}

/// Why this machine cannot run a real node, if it cannot (tests skip with this message).
pub fn unsupported() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("a real node needs root (namespaces, cgroups, mounts)".into());
    }
    // `CAIRN_TEST_HIDE_TOOL` names a tool to treat as missing (the harness's own test of a
    // missing prerequisite).
    let hidden = std::env::var("CAIRN_TEST_HIDE_TOOL").ok();
    for tool in [
        "unshare", "nsenter", "ip", "iptables", "ipset", "mount", "umoci", "skopeo", "busybox",
    ] {
        let found = hidden.as_deref() != Some(tool)
            && ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
                .iter()
                .any(|d| Path::new(d).join(tool).exists());
        if !found {
            return Some(format!(
                "{tool} is not installed (.ci/install.sh installs it)"
            ));
        }
    }
    if !Path::new("/sys/fs/cgroup/memory/cgroup.procs").exists()
        && !Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
    {
        return Some("no cgroup memory controller is mounted".into());
    }
    None
}

/// A running node. Stopped (everything inside it) on drop.
pub struct RealNode {
    pub name: String,
    pub dir: PathBuf,
    /// The node's address (its veth, inside its network namespace).
    pub node_ip: Ipv4Addr,
    /// The host end of the veth.
    pub host_ip: Ipv4Addr,
    pub pod_cidr: String,
    /// The kubelet's cgroupRoot (one directory in every cgroup v1 hierarchy).
    pub cgroup_root: String,
    /// The host side of the veth.
    pub host_veth: String,
    pub ctr: PathBuf,
    /// `/proc/<pid>/ns/net` of the node while it runs.
    netns: PathBuf,
    /// Host PID of the PID namespace's first process (`node.sh`).
    init_pid: Option<i32>,
    unshare: Option<Proc>,
    forwarders: Mutex<Vec<Forwarder>>,
    kubectl: PathBuf,
    kubeconfig: PathBuf,
}

impl RealNode {
    /// Starts a node named `name` in `dir` and waits until it is Ready.
    pub fn start(cp: &ControlPlane, name: &str, dir: &Path) -> Result<Self, HarnessError> {
        if let Some(why) = unsupported() {
            return Err(HarnessError::Setup(why));
        }
        let bins = NodeBinaries::ensure()?;
        let mkdir = |p: &Path| {
            std::fs::create_dir_all(p)
                .map_err(|e| HarnessError::io(format!("creating {}", p.display()), e))
        };
        let write = |p: &Path, text: &str| {
            std::fs::write(p, text)
                .map_err(|e| HarnessError::io(format!("writing {}", p.display()), e))
        };
        for sub in [
            "bin",
            "logs",
            "sysctl",
            "containerd",
            "kubelet/root",
            "pod-logs",
            "cni/net.d",
            "cni/ipam",
        ] {
            mkdir(&dir.join(sub))?;
        }
        // The mount point of the node's private CNI cache; an empty directory on the host.
        mkdir(Path::new("/var/lib/cni"))?;

        let n = subnet_index()?;
        let node_ip = Ipv4Addr::new(10, 250, n, 2);
        let host_ip = Ipv4Addr::new(10, 250, n, 1);
        let pod_cidr = format!("10.251.{n}.0/24");
        let cgroup_root = format!("cairn-node-{n}");
        let host_veth = format!("cairnh{n}");

        // Components find each other by their usual names on PATH.
        let links: [(&str, &Path); 8] = [
            ("kubelet", &bins.kubelet),
            ("kube-proxy", &bins.kube_proxy),
            ("containerd", &bins.containerd),
            ("containerd-shim-runc-v2", &bins.containerd_shim),
            ("ctr", &bins.ctr),
            ("runc", &bins.runc),
            ("kube-router", &bins.kube_router),
            ("kubectl", &cp.kubectl),
        ];
        for (link, target) in links {
            let at = dir.join("bin").join(link);
            let _ = std::fs::remove_file(&at);
            std::os::unix::fs::symlink(target, &at)
                .map_err(|e| HarnessError::io(format!("linking {}", at.display()), e))?;
        }

        for (file, value) in [
            ("overcommit_memory", "1"),
            ("panic", "10"),
            ("panic_on_oops", "1"),
        ] {
            write(&dir.join("sysctl").join(file), &format!("{value}\n"))?;
        }
        let kubeconfig = dir.join("kubeconfig");
        write(
            &kubeconfig,
            &node_kubeconfig(&format!("https://127.0.0.1:{API_PORT}"), cp),
        )?;
        write(&dir.join("resolv.conf"), "nameserver 10.96.0.10\n")?;
        write(
            &dir.join("containerd/config.toml"),
            &containerd_config(dir, &bins),
        )?;
        write(
            &dir.join("cni/net.d/10-cairn.conflist"),
            &cni_config(&pod_cidr, &dir.join("cni/ipam")),
        )?;
        write(
            &dir.join("kubelet/config.yaml"),
            &kubelet_config(dir, &cgroup_root),
        )?;
        write(
            &dir.join("kube-proxy.yaml"),
            &kube_proxy_config(&kubeconfig, name, &pod_cidr),
        )?;
        write(
            &dir.join("node.env"),
            &format!("NODE_NAME={name}\nNODE_IP={node_ip}\nCGROUP_ROOT={cgroup_root}\n"),
        )?;
        let _ = std::fs::remove_file(dir.join("net-ready"));

        let mut cmd = Command::new("unshare");
        cmd.args([
            "--net",
            "--mount",
            "--propagation",
            "slave",
            "--pid",
            "--fork",
            "--kill-child=SIGTERM",
            "--mount-proc",
            "bash",
        ])
        .arg(repo_root().join("tests/harness/node.sh"))
        .arg(dir);
        let unshare = Proc::spawn("node", cmd, &dir.join("logs/node.log"))?;
        let upid = unshare
            .pid()
            .ok_or_else(|| HarnessError::Setup("the node's unshare has no PID".into()))?
            as i32;
        let mut node = Self {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            node_ip,
            host_ip,
            pod_cidr: pod_cidr.clone(),
            cgroup_root,
            host_veth: host_veth.clone(),
            ctr: bins.ctr.clone(),
            netns: PathBuf::from(format!("/proc/{upid}/ns/net")),
            init_pid: None,
            unshare: Some(unshare),
            forwarders: Mutex::new(Vec::new()),
            kubectl: cp.kubectl.clone(),
            kubeconfig: cp.kubeconfig.clone(),
        };
        // The first process of the PID namespace is unshare's only child.
        let deadline = Instant::now() + Duration::from_secs(5);
        while node.init_pid.is_none() {
            node.init_pid = std::fs::read_to_string(format!("/proc/{upid}/task/{upid}/children"))
                .ok()
                .and_then(|c| c.split_whitespace().next().and_then(|p| p.parse().ok()));
            if Instant::now() > deadline {
                return Err(HarnessError::Setup(
                    "the node's PID namespace did not start".into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // The netns is unshare's; wait until it differs from ours.
        let own = std::fs::read_link("/proc/self/ns/net").ok();
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::read_link(&node.netns).ok() == own {
            if Instant::now() > deadline {
                return Err(HarnessError::Setup(
                    "the node's netns did not appear".into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }

        let pid = upid.to_string();
        let host_cidr = format!("{host_ip}/24");
        let node_cidr = format!("{node_ip}/24");
        run("ip", &["link", "del", &host_veth]).ok();
        run(
            "ip",
            &[
                "link", "add", &host_veth, "type", "veth", "peer", "name", "eth0", "netns", &pid,
            ],
        )?;
        run("ip", &["addr", "add", &host_cidr, "dev", &host_veth])?;
        run("ip", &["link", "set", &host_veth, "up"])?;
        let in_node = |args: &[&str]| {
            let mut a = vec!["--target", pid.as_str(), "--net", "ip"];
            a.extend_from_slice(args);
            run("nsenter", &a)
        };
        in_node(&["link", "set", "lo", "up"])?;
        in_node(&["addr", "add", &format!("{API_ENDPOINT_IP}/32"), "dev", "lo"])?;
        in_node(&["addr", "add", &node_cidr, "dev", "eth0"])?;
        in_node(&["link", "set", "eth0", "up"])?;

        let api_target: SocketAddr = cp
            .server
            .trim_start_matches("https://")
            .parse()
            .map_err(|e| HarnessError::Setup(format!("API server address {}: {e}", cp.server)))?;
        let api = Forwarder::start(
            &node.netns,
            SocketAddr::from(([0, 0, 0, 0], API_PORT)),
            api_target,
        )?;
        node.forwarders.get_mut().map_err(|_| poisoned())?.push(api);
        write(&dir.join("net-ready"), "")?;

        // Pods reach the API server through the `kubernetes` Service.
        cp.apply_yaml(&format!(
            r#"apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kubernetes
  namespace: default
  labels: {{kubernetes.io/service-name: kubernetes, endpointslice.kubernetes.io/managed-by: cairn-harness}}
addressType: IPv4
endpoints: [{{addresses: ["{API_ENDPOINT_IP}"], conditions: {{ready: true}}}}]
ports: [{{name: https, port: {API_PORT}, protocol: TCP}}]
"#
        ))?;

        let ready = node.wait_ready(Duration::from_secs(120)).and_then(|()| {
            // The sandbox image, pinned in containerd's config: it is never pulled.
            let pause = built_paths_with("build-images.sh", &["pause"])?.get("pause")?;
            node.import_image(&pause)
        });
        if let Err(e) = ready {
            node.stop();
            return Err(e);
        }
        // No IPAM controller runs: the node's pod range is the bridge's (kube-router reads it).
        node.kubectl_ok(&[
            "patch",
            "node",
            name,
            "--type=merge",
            "-p",
            &format!(r#"{{"spec":{{"podCIDR":"{pod_cidr}","podCIDRs":["{pod_cidr}"]}}}}"#),
        ])?;
        Ok(node)
    }

    fn kubectl_ok(&self, args: &[&str]) -> Result<String, HarnessError> {
        let out = kubectl_output(&self.kubectl, &self.kubeconfig, args)?;
        if !out.status.success() {
            return Err(HarnessError::Kubectl {
                args: args.join(" "),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<(), HarnessError> {
        let (k, kc, name) = (
            self.kubectl.clone(),
            self.kubeconfig.clone(),
            self.name.clone(),
        );
        let logs = self.dir.join("logs");
        let Some(unshare) = self.unshare.as_mut() else {
            return Err(HarnessError::Setup("the node is stopped".into()));
        };
        let res = wait_until("the real node to be Ready", timeout, &mut [unshare], || {
            kubectl_output(
                &k,
                &kc,
                &[
                    "get",
                    "node",
                    &name,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                ],
            )
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "True")
        });
        res.map_err(|e| {
            let mut text = e.to_string();
            for c in ["node", "containerd", "kubelet", "kube-proxy", "kube-router"] {
                let log = logs.join(format!("{c}.log"));
                text.push_str(&format!("\n--- {c}\n{}", tail(&log)));
            }
            HarnessError::Setup(text)
        })
    }

    /// Makes `target` on the host's loopback (a test's S3 server, provider simulator)
    /// reachable from pods at the returned address: the node's IP and a free port on it.
    pub fn forward_to_host(&self, target: SocketAddr) -> Result<SocketAddr, HarnessError> {
        let f = Forwarder::start(&self.netns, SocketAddr::from((self.node_ip, 0)), target)?;
        let addr = f
            .listener
            .local_addr()
            .map_err(|e| HarnessError::io("reading the forwarder's address", e))?;
        self.forwarders.lock().map_err(|_| poisoned())?.push(f);
        Ok(addr)
    }

    /// Makes `target` inside the node's network namespace (a Service's ClusterIP, a pod)
    /// reachable from the host at the returned address on the host's loopback: each
    /// connection is dialled from inside the node's namespace, like a process on the node.
    pub fn forward_from_host(&self, target: SocketAddr) -> Result<SocketAddr, HarnessError> {
        // The node has no default route, so its own processes need one to the Service range
        // (kube-proxy rewrites the destination after routing): onto the pods' bridge, which
        // exists once a pod runs here, so nothing addressed there leaves the namespace.
        let in_service_range =
            matches!(target.ip(), std::net::IpAddr::V4(ip) if ip.octets()[..2] == [10, 96]);
        if in_service_range {
            let ns = format!("--net={}", self.netns.display());
            run(
                "nsenter",
                &[&ns, "ip", "route", "replace", SERVICE_CIDR, "dev", "cni0"],
            )?;
        }
        let f = Forwarder::start_inward(&self.netns, target)?;
        let addr = f
            .listener
            .local_addr()
            .map_err(|e| HarnessError::io("reading the forwarder's address", e))?;
        self.forwarders.lock().map_err(|_| poisoned())?.push(f);
        Ok(addr)
    }

    /// Imports a docker-archive tarball into the node's containerd (`k8s.io` namespace).
    pub fn import_image(&self, archive: &Path) -> Result<(), HarnessError> {
        let sock = self.dir.join("containerd/containerd.sock");
        let out = Command::new(&self.ctr)
            .arg("--address")
            .arg(&sock)
            .args(["-n", "k8s.io", "images", "import", "--no-unpack=false"])
            .arg(archive)
            .output()
            .map_err(|e| HarnessError::io("running ctr images import", e))?;
        if !out.status.success() {
            return Err(HarnessError::Setup(format!(
                "ctr images import {}: {}",
                archive.display(),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(())
    }

    /// Gives an imported image a second name in the node's containerd (a new tag of the
    /// same content: what a rollout to a new image version looks like to the kubelet).
    pub fn tag_image(&self, source: &str, target: &str) -> Result<(), HarnessError> {
        let sock = self.dir.join("containerd/containerd.sock");
        let out = Command::new(&self.ctr)
            .arg("--address")
            .arg(&sock)
            .args(["-n", "k8s.io", "images", "tag", "--force", source, target])
            .output()
            .map_err(|e| HarnessError::io("running ctr images tag", e))?;
        if !out.status.success() {
            return Err(HarnessError::Setup(format!(
                "ctr images tag {source} {target}: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(())
    }

    /// Identity of the node's network and PID namespaces (`net:[inode]`, `pid:[inode]`), for
    /// leak checks; `None` once stopped.
    pub fn namespaces(&self) -> Option<(String, String)> {
        let pid = self.init_pid?;
        let read = |ns: &str| {
            std::fs::read_link(format!("/proc/{pid}/ns/{ns}"))
                .ok()
                .map(|p| p.to_string_lossy().into_owned())
        };
        Some((read("net")?, read("pid")?))
    }

    /// Stops every process of the node and waits until its cgroups are gone. Its namespaces
    /// are held open meanwhile, and a process still in them after the node's init has gone is
    /// killed: nothing of the node outlives `stop`.
    pub fn stop(&mut self) {
        let namespaces = self.namespaces();
        let held: Vec<File> = self.init_pid.map(hold_namespaces).unwrap_or_default();
        let mut gone = true;
        if let Some(pid) = self.init_pid.take() {
            // SAFETY: signalling the PID namespace's first process, which we started.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            while process_alive(pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            gone = !process_alive(pid);
        }
        if let Some(mut p) = self.unshare.take() {
            p.stop(Duration::from_secs(5));
        }
        if let Some(ns) = namespaces {
            kill_left_in(&ns, Duration::from_secs(10));
        }
        drop(held);
        // Sockets hold the network namespace alive: close the forwarders last.
        if let Ok(mut forwarders) = self.forwarders.lock() {
            for f in forwarders.drain(..) {
                f.stop();
            }
        }
        // Unpacked images and pod volumes are large; the logs stay for the curious. (Only
        // now: while the node ran they were mounted inside its mount namespace.)
        if gone {
            for sub in ["containerd/root", "containerd/state", "kubelet/root"] {
                let _ = std::fs::remove_dir_all(self.dir.join(sub));
            }
        }
        // In case the node's own cleanup could not finish.
        for h in cgroup_hierarchies() {
            let root = h.join(&self.cgroup_root);
            if root.exists() {
                let _ = Command::new("find")
                    .arg(&root)
                    .args(["-depth", "-type", "d", "-exec", "rmdir", "{}", "+"])
                    .output();
            }
        }
    }
}

/// The address pods are given as their DNS server (the kubelet's `clusterDNS`).
pub const CLUSTER_DNS_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);

/// CoreDNS serving `cluster.local` to the pods of a node ([`RealNode::start_cluster_dns`]).
/// Stopped on drop (and with the node: it runs in the node's PID namespace).
pub struct ClusterDns {
    proc: Proc,
}

impl ClusterDns {
    /// `Err` with the log's tail when CoreDNS has exited.
    pub fn check_alive(&mut self) -> Result<(), HarnessError> {
        self.proc.check_alive()
    }
}

impl Drop for ClusterDns {
    fn drop(&mut self) {
        self.proc.stop(Duration::from_secs(2));
    }
}

impl RealNode {
    /// Starts the cluster DNS of this node: CoreDNS (`tests/harness/build-coredns.sh`, its
    /// `kubernetes` plugin reading Services through the node's kubeconfig) inside the node's
    /// network and PID namespaces, on [`CLUSTER_DNS_IP`]`:53` — an address on the node's
    /// loopback, where every pod's `resolv.conf` points — so `<service>.<namespace>.svc`
    /// resolves in pods as in a cluster. Nothing is forwarded: other names do not resolve.
    /// Gives once CoreDNS answers its readiness probe.
    pub fn start_cluster_dns(&self) -> Result<ClusterDns, HarnessError> {
        let coredns = built_paths("build-coredns.sh")?.get("coredns")?;
        let pid = self
            .init_pid
            .ok_or_else(|| HarnessError::Setup("the node is stopped".into()))?
            .to_string();
        let ns = format!("--net={}", self.netns.display());
        // Idempotent: a second call finds the address there.
        let _ = run(
            "nsenter",
            &[
                &ns,
                "ip",
                "addr",
                "add",
                &format!("{CLUSTER_DNS_IP}/32"),
                "dev",
                "lo",
            ],
        );
        let ready_port = 8181;
        let corefile = self.dir.join("Corefile");
        std::fs::write(
            &corefile,
            format!(
                ".:53 {{\n    bind {CLUSTER_DNS_IP}\n    errors\n    ready 127.0.0.1:{ready_port}\n    \
                 kubernetes cluster.local in-addr.arpa ip6.arpa {{\n        kubeconfig {} harness\n        \
                 pods insecure\n        fallthrough in-addr.arpa ip6.arpa\n    }}\n}}\n",
                self.dir.join("kubeconfig").display()
            ),
        )
        .map_err(|e| HarnessError::io(format!("writing {}", corefile.display()), e))?;
        let mut cmd = Command::new("nsenter");
        cmd.args(["--target", &pid, "--net", "--pid", "--"])
            .arg(&coredns)
            .arg("-conf")
            .arg(&corefile);
        let mut proc = Proc::spawn("coredns", cmd, &self.dir.join("logs/coredns.log"))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            proc.check_alive()?;
            if self.http_ok_inside(SocketAddr::from(([127, 0, 0, 1], ready_port)), "/ready") {
                return Ok(ClusterDns { proc });
            }
            if Instant::now() > deadline {
                return Err(HarnessError::Timeout {
                    what: "CoreDNS to be ready".into(),
                    after: Duration::from_secs(30),
                    logs: tail(&proc.log),
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Whether `GET path` at `addr`, dialled inside the node's network namespace, answers 200.
    fn http_ok_inside(&self, addr: SocketAddr, path: &str) -> bool {
        let Ok(ns) = File::open(&self.netns) else {
            return false;
        };
        let path = path.to_string();
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            // SAFETY: setns on a valid namespace fd, affecting only this short-lived thread.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return false;
            }
            let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
                return false;
            };
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            if s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
                .is_err()
            {
                return false;
            }
            let mut head = [0u8; 12];
            s.read_exact(&mut head).is_ok() && head.ends_with(b" 200")
        })
        .join()
        .unwrap_or(false)
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The cgroup v1 hierarchies (and the v2 one, if mounted) of this machine.
pub fn cgroup_hierarchies() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| !p.is_symlink() && p.join("cgroup.procs").exists())
        .collect()
}

fn poisoned() -> HarnessError {
    HarnessError::Setup("the node's forwarder list lock is poisoned".into())
}

/// The processes (zombies too) whose network or PID namespace is one of `ns` (`net:[inode]`,
/// `pid:[inode]`, as [`RealNode::namespaces`] gives them).
pub fn processes_in(ns: &(String, String)) -> Vec<i32> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let link = |n: &str| {
            std::fs::read_link(format!("/proc/{pid}/ns/{n}"))
                .map(|l| l.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        if link("net") == ns.0 || link("pid") == ns.1 {
            found.push(pid);
        }
    }
    found
}

/// Holds the network and PID namespaces of `pid` open for as long as the files live: a
/// freed namespace's inode number goes to the next namespace made, maybe another test's pod,
/// whose processes would then pass for the node's.
pub fn hold_namespaces(pid: i32) -> Vec<File> {
    ["net", "pid"]
        .iter()
        .filter_map(|n| File::open(format!("/proc/{pid}/ns/{n}")).ok())
        .collect()
}

/// SIGKILLs every live process whose network or PID namespace is one of `ns` until none is
/// left or `within` has passed. The caller holds the namespaces open, so their inode numbers
/// cannot have gone to another namespace.
fn kill_left_in(ns: &(String, String), within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let left: Vec<i32> = processes_in(ns)
            .into_iter()
            .filter(|pid| process_alive(*pid))
            .collect();
        if left.is_empty() || Instant::now() >= deadline {
            return;
        }
        for pid in left {
            // SAFETY: signalling a process of the node's own namespaces.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn process_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

/// A third octet for the node's networks that no interface of the host uses yet; derived
/// from the PID so concurrent harnesses rarely collide.
fn subnet_index() -> Result<u8, HarnessError> {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr"])
        .output()
        .map_err(|e| HarnessError::io("running ip addr", e))?;
    let used = String::from_utf8_lossy(&out.stdout).into_owned();
    let start = std::process::id() % 200;
    (0..200)
        .map(|i| ((start + i) % 200 + 20) as u8)
        .find(|n| !used.contains(&format!("10.250.{n}.")))
        .ok_or_else(|| HarnessError::Setup("no free 10.250.N.0/24 for the node".into()))
}

fn run(program: &str, args: &[&str]) -> Result<(), HarnessError> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| HarnessError::io(format!("running {program}"), e))?;
    if !out.status.success() {
        return Err(HarnessError::Setup(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

fn node_kubeconfig(server: &str, cp: &ControlPlane) -> String {
    let s = |p: PathBuf| p.to_string_lossy().into_owned();
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: harness\n  cluster:\n    server: {server}\n    certificate-authority: {}\n\
users:\n- name: node\n  user:\n    client-certificate: {}\n    client-key: {}\n\
contexts:\n- name: harness\n  context:\n    cluster: harness\n    user: node\ncurrent-context: harness\n",
        s(cp.pki.ca_crt()),
        s(cp.pki.admin_crt()),
        s(cp.pki.admin_key())
    )
}

fn containerd_config(dir: &Path, bins: &NodeBinaries) -> String {
    let d = |p: &str| dir.join(p).to_string_lossy().into_owned();
    format!(
        r#"version = 4
root = "{root}"
state = "{state}"
imports = []

[plugins.'io.containerd.server.v1.grpc']
  address = "{sock}"

[plugins.'io.containerd.server.v1.ttrpc']
  address = "{sock}.ttrpc"

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{PAUSE_IMAGE}"

[plugins.'io.containerd.cri.v1.runtime']
  # This machine lacks CAP_SYS_RESOURCE: runc may not lower its own oom_score_adj.
  restrict_oom_score_adj = true
  # Pod network namespaces under the state directory, not the host's /run/netns.
  netns_mounts_under_state_dir = true

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["{cni_bin}"]
  conf_dir = "{cni_conf}"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  BinaryName = "{runc}"
  SystemdCgroup = false

[plugins.'io.containerd.internal.v1.opt']
  path = "{opt}"

[plugins.'io.containerd.nri.v1.nri']
  disable = true
"#,
        root = d("containerd/root"),
        state = d("containerd/state"),
        sock = d("containerd/containerd.sock"),
        cni_bin = bins.cni_bin_dir.to_string_lossy(),
        cni_conf = d("cni/net.d"),
        runc = bins.runc.to_string_lossy(),
        opt = d("containerd/opt"),
    )
}

fn cni_config(pod_cidr: &str, ipam_dir: &Path) -> String {
    format!(
        r#"{{
  "cniVersion": "1.0.0",
  "name": "cairn",
  "plugins": [
    {{
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {{
        "type": "host-local",
        "ranges": [[{{"subnet": "{pod_cidr}"}}]],
        "routes": [{{"dst": "0.0.0.0/0"}}],
        "dataDir": "{}"
      }}
    }},
    {{"type": "portmap", "capabilities": {{"portMappings": true}}}}
  ]
}}
"#,
        ipam_dir.display()
    )
}

fn kubelet_config(dir: &Path, cgroup_root: &str) -> String {
    let d = |p: &str| dir.join(p).to_string_lossy().into_owned();
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# The controllers of this machine are bound to cgroup v1.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup_root}
containerRuntimeEndpoint: unix://{sock}
authentication:
  anonymous: {{enabled: true}}
  webhook: {{enabled: false}}
authorization: {{mode: AlwaysAllow}}
readOnlyPort: 0
healthzPort: 0
resolvConf: {resolv}
clusterDNS: [10.96.0.10]
clusterDomain: cluster.local
podLogsDir: {logs}
failSwapOn: false
syncFrequency: 5s
serializeImagePulls: false
# The disk is shared and may be nearly full of other people's files: evict only when it
# really is full, never garbage-collect images.
evictionHard: {{"memory.available": "100Mi", "nodefs.available": "100Mi", "imagefs.available": "100Mi", "nodefs.inodesFree": "1%"}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
"#,
        sock = d("containerd/containerd.sock"),
        resolv = d("resolv.conf"),
        logs = d("pod-logs"),
    )
}

fn kube_proxy_config(kubeconfig: &Path, name: &str, pod_cidr: &str) -> String {
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {{kubeconfig: {}}}
hostnameOverride: {name}
mode: iptables
clusterCIDR: {pod_cidr}
# Replies from a backend on the same bridge come back through the node.
iptables: {{masqueradeAll: true}}
# 0: leave the machine-wide nf_conntrack_max alone.
conntrack: {{maxPerCore: 0}}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
"#,
        kubeconfig.display()
    )
}

/// Accepts TCP connections inside a network namespace and relays each to `target` on the
/// host (the API server on loopback), or the other way round.
struct Forwarder {
    listener: Arc<TcpListener>,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Forwarder {
    fn start(netns: &Path, listen: SocketAddr, target: SocketAddr) -> Result<Self, HarnessError> {
        let ns = File::open(netns)
            .map_err(|e| HarnessError::io(format!("opening {}", netns.display()), e))?;
        // setns moves only the calling thread: bind from a short-lived thread; the socket
        // stays in the namespace it was created in.
        let listener = std::thread::spawn(move || -> std::io::Result<TcpListener> {
            // SAFETY: setns on a valid namespace fd, affecting only this thread.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            TcpListener::bind(listen)
        })
        .join()
        .map_err(|_| HarnessError::Setup("the forwarder's bind thread panicked".into()))?
        .map_err(|e| HarnessError::io(format!("listening on {listen} in the node"), e))?;
        Ok(Self::serve(listener, target, None))
    }

    /// Accepts TCP connections on the host's loopback and relays each to `target`, dialled
    /// from inside the network namespace `netns`.
    fn start_inward(netns: &Path, target: SocketAddr) -> Result<Self, HarnessError> {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .map_err(|e| HarnessError::io("listening on the host's loopback", e))?;
        Ok(Self::serve(listener, target, Some(netns.to_path_buf())))
    }

    fn serve(listener: TcpListener, target: SocketAddr, dial_in: Option<PathBuf>) -> Self {
        let listener = Arc::new(listener);
        let stopping = Arc::new(AtomicBool::new(false));
        let (l, stop) = (Arc::clone(&listener), Arc::clone(&stopping));
        let thread = std::thread::spawn(move || {
            for conn in l.incoming() {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(accepted) = conn else { continue };
                let dial_in = dial_in.clone();
                std::thread::spawn(move || {
                    // setns moves only this connection's thread.
                    if let Some(ns) = dial_in {
                        let Ok(ns) = File::open(ns) else { return };
                        // SAFETY: setns on a valid namespace fd, affecting only this thread.
                        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                            return;
                        }
                    }
                    relay(accepted, target)
                });
            }
        });
        Self {
            listener,
            stopping,
            thread: Some(thread),
        }
    }

    fn stop(mut self) {
        self.stopping.store(true, Ordering::Relaxed);
        // SAFETY: shutting down our own listening socket wakes the accept loop.
        unsafe {
            libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn relay(inside: TcpStream, target: SocketAddr) {
    let Ok(outside) = TcpStream::connect_timeout(&target, Duration::from_secs(5)) else {
        return;
    };
    let (Ok(mut a), Ok(mut b)) = (inside.try_clone(), outside.try_clone()) else {
        return;
    };
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut a, &mut b);
        let _ = b.shutdown(Shutdown::Write);
    });
    let (mut inside, mut outside) = (inside, outside);
    let _ = std::io::copy(&mut outside, &mut inside);
    let _ = inside.shutdown(Shutdown::Write);
    let _ = up.join();
}
