//! The agent with the operator's scoped credentials, against a store that enforces them
//! (SeaweedFS, `tests/harness/build-seaweedfs.sh`): credentials minted by the operator's code
//! for two sessions, laid out as the pod mounts their Secrets (one file per key, the
//! directory named by `CAIRN_S3_CREDENTIALS_DIR`). The agent's own archive client and the
//! real `cairn-agent` binary reach their session's prefix and nothing of the other's, and a
//! running agent follows credentials the operator refreshed, without a restart.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use cairn_agent::config::{ConfigFile, Storage, StorageSettings};
use cairn_operator::config::{Defaults, ScopedArchive};
use cairn_operator::scoped::{self, MintTarget};
use cairn_tests::harness::seaweedfs::{ADMIN_ACCESS_KEY_ID, ADMIN_SECRET_ACCESS_KEY, ROLE_ARN};
use cairn_tests::harness::{SeaweedFs, SeaweedOptions};

const NS: &str = "team-a";

fn config(dir: &Path, session: &str, endpoint: &str) -> PathBuf {
    let path = dir.join(format!("{session}.yaml"));
    std::fs::write(
        &path,
        format!(
            "name: {session}\nnamespace: {NS}\nprovider: {{kind: openai-compatible, model: m, baseUrl: 'http://127.0.0.1:9/v1'}}\narchive: {{bucket: cairn, endpoint: '{endpoint}', region: us-east-1, forcePathStyle: true}}\n"
        ),
    )
    .expect("write config");
    path
}

/// SeaweedFS with the `cairn` bucket, and the operator's defaults in scoped mode against it
/// (the admin key pair in a directory, as the operator's pod mounts it).
fn scoped_store(dir: &Path, options: &SeaweedOptions) -> (SeaweedFs, Defaults) {
    let store = SeaweedFs::start(dir, &["cairn"], options).expect("seaweedfs starts");
    let admin = dir.join("admin");
    std::fs::create_dir_all(&admin).expect("admin dir");
    std::fs::write(admin.join("AWS_ACCESS_KEY_ID"), ADMIN_ACCESS_KEY_ID).expect("write");
    std::fs::write(admin.join("AWS_SECRET_ACCESS_KEY"), ADMIN_SECRET_ACCESS_KEY).expect("write");
    let mut defaults = Defaults::default();
    defaults.archive.bucket = Some("cairn".into());
    defaults.archive.endpoint = Some(store.endpoint.clone());
    defaults.archive.scoped = Some(ScopedArchive {
        role_arn: Some(ROLE_ARN.into()),
        sts_endpoint: None,
        duration: Duration::from_secs(900),
        refresh_before: None,
        admin_credentials_dir: admin,
    });
    (store, defaults)
}

/// Mints the session's credentials with the operator's code and writes its Secret's data as
/// files of a directory; returns the directory.
async fn mounted_credentials(defaults: &Defaults, root: &Path, session: &str) -> PathBuf {
    let dir = root.join(format!("creds-{session}"));
    std::fs::create_dir_all(&dir).expect("dir");
    for (k, v) in minted_data(defaults, session).await {
        std::fs::write(dir.join(k), v).expect("write key");
    }
    dir
}

/// A fresh minting for `session` as its Secret's data (key → bytes).
async fn minted_data(defaults: &Defaults, session: &str) -> Vec<(String, Vec<u8>)> {
    let mut s = cairn_crds::AgentSession::new(
        session,
        serde_json::from_value(serde_json::json!({"provider": {"kind": "openai", "model": "m"}}))
            .expect("spec"),
    );
    s.metadata.namespace = Some(NS.into());
    s.metadata.uid = Some(format!("uid-{session}"));
    let plan = cairn_operator::validate(&s, None, defaults).expect("plan");
    let config = defaults.archive.scoped.clone().expect("scoped");
    let target = MintTarget::for_plan(&plan).expect("target");
    let creds = scoped::mint(&config, &target).await.expect("mint");
    let secret = scoped::credentials_secret(&plan, &creds, &target.scope(), SystemTime::now());
    secret
        .data
        .expect("data")
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect()
}

/// Publishes `data` in `dir` the way the kubelet updates a Secret volume: a new timestamped
/// directory, the `..data` link swapped to it in one rename, each key a link through
/// `..data`.
fn publish(dir: &Path, generation: u32, data: &[(String, Vec<u8>)]) {
    let stamped = format!("..gen{generation}");
    std::fs::create_dir_all(dir.join(&stamped)).expect("generation dir");
    for (name, value) in data {
        std::fs::write(dir.join(&stamped).join(name), value).expect("write key");
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{name}"), &link).expect("key link");
        }
    }
    let staging = dir.join("..data_tmp");
    std::os::unix::fs::symlink(&stamped, &staging).expect("staging link");
    std::fs::rename(&staging, dir.join("..data")).expect("swap ..data");
}

/// Storage of `session` as the agent opens it, with the credentials in `creds`.
fn storage(config: &Path, creds: &Path, data: &Path) -> Storage {
    let cfg = ConfigFile::load(config).expect("config");
    let env = [
        ("CAIRN_S3_CREDENTIALS_DIR", creds.display().to_string()),
        ("XDG_DATA_HOME", data.display().to_string()),
        ("CAIRN_CACHE_DIR", data.join("cache").display().to_string()),
        ("CAIRN_S3_TIMEOUT_SECS", "5".to_string()),
    ];
    let lookup = |k: &str| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
    let settings = StorageSettings::from_spec(&cfg.spec, lookup).expect("settings");
    Storage::open(&settings, &cfg.namespace, &cfg.name).expect("storage")
}

/// `cairn-agent recall KEY --config CONFIG` with the credentials in `creds` and an empty
/// local cache (only the store can answer).
fn recall(key: &str, config: &Path, creds: &Path, data: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_cairn-agent"))
        .args(["recall", key, "--config"])
        .arg(config)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("CAIRN_S3_CREDENTIALS_DIR", creds)
        .env("XDG_DATA_HOME", data)
        .env("HOME", data)
        .env("CAIRN_CACHE_DIR", data.join("cache"))
        .env("CAIRN_S3_TIMEOUT_SECS", "5")
        .output()
        .expect("cairn-agent runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_reaches_its_own_prefix_with_scoped_credentials_and_not_another_sessions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, defaults) = scoped_store(dir.path(), &SeaweedOptions::default());
    let creds_a = mounted_credentials(&defaults, dir.path(), "alpha").await;
    let creds_b = mounted_credentials(&defaults, dir.path(), "beta").await;
    assert!(creds_a.join("AWS_SESSION_TOKEN").is_file());
    assert!(creds_a.join("AWS_CREDENTIAL_EXPIRATION").is_file());
    let config_a = config(dir.path(), "alpha", &store.endpoint);
    let data = |name: &str| {
        let d = dir.path().join(name);
        std::fs::create_dir_all(&d).expect("data dir");
        d
    };

    // Session A's agent: its archive check (a probe written, read back and deleted) passes,
    // and what it archives its own binary recalls from the store.
    let a = storage(&config_a, &creds_a, &data("a-lib"));
    let check = a.check().await;
    assert!(check.ok, "{check:?}");
    assert_eq!(check.location, "s3://cairn/cairn/team-a/alpha/");
    let original = b"the original tool output of session alpha".to_vec();
    let key = a.store.archive(&original).await.expect("archive");
    let out = recall(key.as_str(), &config_a, &creds_a, &data("a-bin"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, original);

    // Session B's credentials under session A's name: the check fails with the store's
    // refusal (no PUT), and the binary cannot read A's original.
    let b_as_a = storage(&config_a, &creds_b, &data("b-lib"));
    let check = b_as_a.check().await;
    assert!(!check.ok, "{check:?}");
    let message = check.message.unwrap_or_default();
    assert!(message.contains("AccessDenied"), "{message}");
    let out = recall(key.as_str(), &config_a, &creds_b, &data("b-bin"));
    assert!(!out.status.success(), "B recalled A's original");
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("AccessDenied"), "{stderr}");
    assert!(!stderr.contains("the original tool output"), "{stderr}");
    // And with its own name it has an archive of its own, empty of A's key.
    let config_b = config(dir.path(), "beta", &store.endpoint);
    let b = storage(&config_b, &creds_b, &data("b-own"));
    assert!(b.check().await.ok);
    let out = recall(key.as_str(), &config_b, &creds_b, &data("b-bin2"));
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    drop(store);
}

/// The operator refreshes scoped credentials before they expire by rewriting the session's
/// Secret; the kubelet swaps the mounted files. The store here caps every STS session at 30 s,
/// so within the test the first credentials really expire: the same open archive client
/// keeps working on the second ones, and the first are refused by then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_agent_follows_refreshed_scoped_credentials_without_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lifetime = Duration::from_secs(30);
    let options = SeaweedOptions {
        max_session: Some(lifetime),
    };
    let (store, defaults) = scoped_store(dir.path(), &options);
    let config_a = config(dir.path(), "alpha", &store.endpoint);
    let data = |name: &str| {
        let d = dir.path().join(name);
        std::fs::create_dir_all(&d).expect("data dir");
        d
    };

    // The first minting, mounted; the agent's archive client opens once.
    let first = minted_data(&defaults, "alpha").await;
    let minted_at = std::time::Instant::now();
    let mounted = dir.path().join("mounted");
    publish(&mounted, 1, &first);
    let a = storage(&config_a, &mounted, &data("a"));
    assert!(a.check().await.ok);
    let before = b"archived with the first credentials".to_vec();
    let key_before = a.store.archive(&before).await.expect("archive");

    // The refresh, well before the first expire.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let second = minted_data(&defaults, "alpha").await;
    assert_ne!(
        first.iter().find(|(k, _)| k == "AWS_ACCESS_KEY_ID"),
        second.iter().find(|(k, _)| k == "AWS_ACCESS_KEY_ID"),
        "a new key pair"
    );
    publish(&mounted, 2, &second);

    // Past the first credentials' lifetime.
    let past = lifetime + Duration::from_secs(4);
    if let Some(left) = past.checked_sub(minted_at.elapsed()) {
        tokio::time::sleep(left).await;
    }
    let stale = dir.path().join("stale");
    publish(&stale, 1, &first);
    let check = storage(&config_a, &stale, &data("stale")).check().await;
    assert!(!check.ok, "the first credentials still work: {check:?}");

    // The same client: writes and reads on the refreshed credentials.
    let after = b"archived after the first credentials expired".to_vec();
    let key_after = a
        .store
        .archive(&after)
        .await
        .expect("archive after the refresh");
    assert_eq!(
        a.store.fetch(&key_after).await.expect("fetch").as_deref(),
        Some(after.as_slice())
    );
    // And the first original, from the store (an empty cache: a fresh client on the same
    // mounted directory).
    let fresh = storage(&config_a, &mounted, &data("fresh"));
    assert_eq!(
        fresh
            .store
            .fetch(&key_before)
            .await
            .expect("fetch")
            .as_deref(),
        Some(before.as_slice())
    );
    drop(store);
}
