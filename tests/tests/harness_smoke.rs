use cairn_tests::harness::{ControlPlane, run_dir};

#[test]
fn smoke() {
    let dir = run_dir("smoke").unwrap();
    let t = std::time::Instant::now();
    let cp = ControlPlane::start(&dir).unwrap();
    eprintln!("up in {:?}", t.elapsed());
    eprintln!(
        "{}",
        cp.kubectl_ok(&["get", "nodes", "-o", "wide"]).unwrap()
    );
    cp.apply_yaml("apiVersion: v1\nkind: Pod\nmetadata: {name: p1, namespace: default}\nspec:\n  containers: [{name: c, image: busybox}]\n").unwrap();
    for _ in 0..30 {
        let s = cp
            .kubectl_ok(&["get", "pod", "p1", "-o", "jsonpath={.status.phase}"])
            .unwrap();
        if s == "Running" {
            eprintln!("pod running after {:?}", t.elapsed());
            return;
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
    panic!(
        "pod never Running: {}",
        cp.kubectl_ok(&["describe", "pod", "p1"]).unwrap()
    );
}
