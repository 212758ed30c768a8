//! The pod runtime: a Running pod becomes a local process with the pod's env (literal,
//! Secret, ConfigMap, fieldRef), its volumes (ConfigMap volumes filled), rewritten listen ports, and the identity of its
//! own ServiceAccount (real RBAC: it can do what its Role allows and nothing else); deleting
//! the pod stops the process.

use std::time::Duration;

use cairn_tests::harness::runtime::ImageMap;
use cairn_tests::harness::{PodRuntime, shared_cluster};

#[test]
fn running_pods_become_processes_with_the_pods_identity() {
    let cp = shared_cluster();
    let ns = "runtime";
    let _ = cp.kubectl(&["create", "namespace", ns]);
    let kubectl = cp.kubectl.to_string_lossy().into_owned();
    let manifest = format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: probe, namespace: {ns}}}
---
apiVersion: v1
kind: Secret
metadata: {{name: creds, namespace: {ns}}}
stringData: {{token: s3cr3t}}
---
apiVersion: v1
kind: Secret
metadata: {{name: other, namespace: {ns}}}
stringData: {{token: not-yours}}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: prompts, namespace: {ns}}}
data: {{reviewer: "You review code."}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: probe, namespace: {ns}}}
rules:
- apiGroups: [""]
  resources: [secrets]
  resourceNames: [creds]
  verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: probe, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: probe}}
subjects: [{{kind: ServiceAccount, name: probe, namespace: {ns}}}]
---
apiVersion: v1
kind: Pod
metadata:
  name: probe
  namespace: {ns}
  labels: {{cairn.dev/runtime-test: "yes"}}
spec:
  serviceAccountName: probe
  containers:
  - name: probe
    image: harness.local/shell
    command: ["/bin/sh", "-c"]
    args:
    - |
      echo "secret=$TOKEN pod=$POD ns=$NS" > "$OUT"
      "$KUBECTL" auth whoami -o jsonpath='{{.status.userInfo.username}}' > "$OUT.whoami"
      "$KUBECTL" get secret creds -o jsonpath='{{.data.token}}' > "$OUT.own" 2>&1
      "$KUBECTL" get secret other > "$OUT.other" 2>&1
      cat "$PROMPT_FILE" > "$OUT.prompt"
      echo done > "$OUT.done"
      exec sleep 600
    env:
    - {{name: KUBECTL, value: "{kubectl}"}}
    - {{name: OUT, value: /data/out}}
    - {{name: PROMPT_FILE, value: /etc/prompt/system-prompt}}
    - name: TOKEN
      valueFrom: {{secretKeyRef: {{name: creds, key: token}}}}
    - name: POD
      valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}
    - name: NS
      valueFrom: {{fieldRef: {{fieldPath: metadata.namespace}}}}
    volumeMounts: [{{name: data, mountPath: /data}}, {{name: prompt, mountPath: /etc/prompt, readOnly: true}}]
  volumes:
  - {{name: data, emptyDir: {{}}}}
  - {{name: prompt, configMap: {{name: prompts, items: [{{key: reviewer, path: system-prompt}}]}}}}
"#
    );
    let runtime = PodRuntime::start(cp, ImageMap::new(), "cairn.dev/runtime-test=yes")
        .expect("runtime starts");
    cp.apply_yaml(&manifest).expect("applied");
    let pod = runtime
        .wait_for(ns, "probe", Duration::from_secs(60))
        .expect("the pod's process starts");
    let out = pod.root.join("volumes/data/out");
    let done = pod.root.join("volumes/data/out.done");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !done.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the probe did not finish; log:\n{}",
            std::fs::read_to_string(&pod.log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let read = |suffix: &str| {
        std::fs::read_to_string(format!("{}{suffix}", out.display())).unwrap_or_default()
    };
    assert_eq!(read("").trim(), "secret=s3cr3t pod=probe ns=runtime");
    assert_eq!(
        read(".whoami"),
        "system:serviceaccount:runtime:probe",
        "the process acts as the pod's ServiceAccount"
    );
    assert_eq!(
        read(".own"),
        "czNjcjN0",
        "its Role lets it read its own Secret"
    );
    assert!(
        read(".other").contains("Forbidden"),
        "but not another Secret: {}",
        read(".other")
    );

    cp.kubectl_ok(&["delete", "pod", "probe", "-n", ns, "--wait=false"])
        .expect("delete");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::path::Path::new(&format!("/proc/{}", pod.pid)).exists()
        && !std::fs::read_to_string(format!("/proc/{}/stat", pod.pid))
            .unwrap_or_default()
            .contains(") Z")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the process outlived its pod"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(runtime.pod(ns, "probe").is_none());
    assert!(runtime.errors().is_empty(), "{:?}", runtime.errors());
}
