//! End to end, as `make demo DEMO_FLAGS=--kwok` runs it: chart-installed operator, agent pod run by the
//! harness with its own ServiceAccount, real nginx 413, each compaction level at work, status
//! and Events written back.
//! (`make demo` runs the same on a real node; `real_node.rs` tests what only a real pod shows.)

use cairn_tests::demo::{self, DemoOptions};

#[test]
fn the_demo_shows_each_compaction_level_and_a_413_recovery() {
    let opts = DemoOptions {
        bin_dir: demo::default_bin_dir(),
        ..DemoOptions::default()
    };
    let mut log = |m: &str| eprintln!("demo: {m}");
    let d = demo::start(&opts, &mut log).unwrap_or_else(|e| panic!("{e}"));
    let report = d.drive(&opts, &mut log).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{}", report.table);
    let s = &report.session["status"];
    assert_eq!(report.answered, opts.turns, "every turn answers: {s}");
    assert!(report.proxy_413s >= 1, "nginx rejected a request");
    assert_eq!(s["phase"], "Running", "{s}");
    let session = &s["session"];
    assert!(session["recoveries"].as_u64().unwrap_or(0) >= 1, "{s}");
    assert!(session["compactions"].as_u64().unwrap_or(0) >= 1, "{s}");
    assert!(
        session["learnedPayloadCap"]
            .as_u64()
            .is_some_and(|c| c < 20 * 1024),
        "{s}"
    );
    assert!(report.table.contains("Running"), "{}", report.table);
    // What the demo shows a newcomer: each level of the ladder at work and a recovery, as
    // the agent's own Events on the session name them.
    assert_eq!(
        report.levels_seen(),
        vec![1, 2, 3],
        "each level changed the history: {:#?}",
        report.events
    );
    assert!(report.recovered(), "{:#?}", report.events);
    assert!(
        session["summaries"]["accepted"].as_u64().unwrap_or(0) >= 1,
        "a summary passed the quality gate: {s}"
    );
    // Every compaction and recovery kept at least 90 % of what it replaced in sight (the
    // default quality.minScore), a summary or none.
    let scores = report.scores();
    assert_eq!(scores.len(), report.events.len(), "{:#?}", report.events);
    assert!(
        scores.iter().all(|s| *s >= 0.9),
        "{scores:?}: {:#?}",
        report.events
    );
}

/// `make demo` as it runs by default: the same system with the chart's operator pod and the
/// agent pod as real containers on a real node (skipped, saying why, on a machine that
/// cannot run one; failed instead under `CI=true`).
#[test]
fn the_demo_on_a_real_node_compacts_recovers_from_a_413_and_reports_it() {
    if let Some(why) = demo::real_node_unsupported()
        && cairn_tests::harness::skip_for(&format!("this machine cannot run a real node: {why}"))
    {
        return;
    }
    let opts = DemoOptions {
        bin_dir: demo::default_bin_dir(),
        real_node: true,
        ..DemoOptions::default()
    };
    let mut log = |m: &str| eprintln!("demo: {m}");
    let d = demo::start(&opts, &mut log).unwrap_or_else(|e| panic!("{e}"));
    let node = d.node.as_ref().expect("the demo runs a real node");
    let on = |ns: &str, selector: &str| {
        d.cp.kubectl_ok(&[
            "get",
            "pods",
            "-n",
            ns,
            "-l",
            selector,
            "-o",
            "jsonpath={.items[*].spec.nodeName}",
        ])
        .unwrap_or_default()
    };
    assert_eq!(
        on("cairn-system", "app.kubernetes.io/instance=cairn"),
        node.name,
        "the operator pod runs on the real node"
    );
    let report = d.drive(&opts, &mut log).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{}", report.table);
    let pod =
        d.cp.kubectl_ok(&[
            "get",
            "pod",
            "cairn-demo-0",
            "-n",
            "demo",
            "-o",
            "jsonpath={.spec.nodeName} {.status.containerStatuses[0].containerID}",
        ])
        .unwrap_or_default();
    assert!(
        pod.starts_with(&format!("{} containerd://", node.name)),
        "the agent is a container on the real node: {pod}"
    );
    let s = &report.session["status"];
    assert_eq!(report.answered, opts.turns, "every turn answers: {s}");
    assert!(report.proxy_413s >= 1, "nginx rejected a request");
    assert_eq!(s["phase"], "Running", "{s}");
    let session = &s["session"];
    assert!(session["recoveries"].as_u64().unwrap_or(0) >= 1, "{s}");
    assert!(session["compactions"].as_u64().unwrap_or(0) >= 1, "{s}");
    assert!(
        session["archive"]["objects"].as_u64().unwrap_or(0) >= 1,
        "{s}"
    );
    assert_eq!(report.levels_seen(), vec![1, 2, 3], "{:#?}", report.events);
    assert!(report.recovered(), "{:#?}", report.events);
    let scores = report.scores();
    assert!(
        !scores.is_empty() && scores.iter().all(|s| *s >= 0.9),
        "{scores:?}: {:#?}",
        report.events
    );
}

/// The same system, then what the operator issue asks of a chart-installed operator and a
/// harness-run agent pod: the agent's own ServiceAccount reaches its session and status but
/// not another session's Secret; a policy patch changes the hash without restarting the pod,
/// and the running agent reports the new policy.
#[test]
fn the_agent_pod_has_its_own_identity_and_follows_policy_edits_live() {
    use std::process::Command;
    use std::time::{Duration, Instant};

    let opts = DemoOptions {
        bin_dir: demo::default_bin_dir(),
        turns: 1,
        ..DemoOptions::default()
    };
    let mut log = |m: &str| eprintln!("demo: {m}");
    let d = demo::start(&opts, &mut log).unwrap_or_else(|e| panic!("{e}"));
    let pods = d.pods.as_ref().expect("the demo runs on kwok's node");
    let pod = pods
        .pod("demo", "cairn-demo-0")
        .expect("the agent pod runs");
    let as_agent = |args: &[&str]| {
        Command::new(&d.cp.kubectl)
            .arg(format!(
                "--kubeconfig={}",
                pod.root.join("kubeconfig").display()
            ))
            .args(args)
            .output()
            .expect("kubectl runs")
    };
    let whoami = as_agent(&[
        "auth",
        "whoami",
        "-o",
        "jsonpath={.status.userInfo.username}",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&whoami.stdout),
        "system:serviceaccount:demo:cairn-demo"
    );
    assert!(
        as_agent(&["get", "asess", "demo", "-n", "demo"])
            .status
            .success(),
        "reads its session"
    );
    // The agent writes status.session itself (server-side apply, no read first): its Role
    // allows patching the status subresource of its own session only.
    let can = |args: &[&str]| {
        String::from_utf8_lossy(&as_agent(args).stdout)
            .trim()
            .to_string()
    };
    assert_eq!(
        can(&[
            "auth",
            "can-i",
            "patch",
            "agentsessions.cairn.dev/demo",
            "--subresource=status",
            "-n",
            "demo"
        ]),
        "yes"
    );
    assert_eq!(
        can(&[
            "auth",
            "can-i",
            "patch",
            "agentsessions.cairn.dev/other",
            "--subresource=status",
            "-n",
            "demo"
        ]),
        "no"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while d
        .cp
        .kubectl_ok(&[
            "get",
            "asess",
            "demo",
            "-n",
            "demo",
            "-o",
            "jsonpath={.status.session.turns}",
        ])
        .unwrap_or_default()
        .is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "the agent never wrote status.session"
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    d.cp.apply_yaml(
        "apiVersion: cairn.dev/v1beta1\nkind: AgentSession\nmetadata: {name: other, namespace: demo}\nspec:\n  provider: {kind: anthropic, model: claude-sonnet-4-5}\n",
    )
    .expect("a second session");
    let deadline = Instant::now() + Duration::from_secs(60);
    while d
        .cp
        .kubectl(&["get", "secret", "cairn-other-api-token", "-n", "demo"])
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        assert!(
            Instant::now() < deadline,
            "the other session's token Secret never appeared"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let other = as_agent(&["get", "secret", "cairn-other-api-token", "-n", "demo"]);
    assert!(
        !other.status.success(),
        "must not read another session's Secret"
    );
    assert!(
        String::from_utf8_lossy(&other.stderr).contains("Forbidden"),
        "{}",
        String::from_utf8_lossy(&other.stderr)
    );

    // Policy edit: new hash, same pod, same process; the agent runs with it on the next turn.
    let hash = |cp: &cairn_tests::harness::ControlPlane| {
        cp.kubectl_ok(&[
            "get",
            "asess",
            "demo",
            "-n",
            "demo",
            "-o",
            "jsonpath={.status.policyHash}",
        ])
        .unwrap_or_default()
    };
    let before = hash(&d.cp);
    assert!(!before.is_empty());
    d.cp.kubectl_ok(&[
        "patch",
        "asess",
        "demo",
        "-n",
        "demo",
        "--type=merge",
        "-p",
        r#"{"spec":{"compaction":{"budgetRatio":0.5}}}"#,
    ])
    .expect("policy patch");
    let deadline = Instant::now() + Duration::from_secs(60);
    let after = loop {
        let h = hash(&d.cp);
        if h != before {
            break h;
        }
        assert!(Instant::now() < deadline, "policyHash never changed");
        std::thread::sleep(Duration::from_millis(300));
    };
    let uid =
        d.cp.kubectl_ok(&[
            "get",
            "pod",
            "cairn-demo-0",
            "-n",
            "demo",
            "-o",
            "jsonpath={.metadata.uid}",
        ])
        .expect("pod");
    assert_eq!(uid, pod.uid, "a policy edit does not replace the pod");
    assert_eq!(
        pods.pod("demo", "cairn-demo-0").map(|p| p.pid),
        Some(pod.pid),
        "nor restart the agent"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, _) = d.turn("one more turn under the new policy").expect("turn");
        assert_eq!(status, 200);
        let (_, view) = d.call("GET", "/v1/session", None).expect("session");
        if view["policyHash"] == after.as_str() {
            assert_eq!(view["policy"]["budgetRatio"], 0.5, "{view}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the agent never reported the new policy: {view}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}
