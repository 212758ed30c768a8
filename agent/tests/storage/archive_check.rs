//! The agent checks that its archive answers — a probe object written, read back and
//! deleted on the durable tier with its own credentials — and reports the result in
//! `status.session.archiveCheck` (also `GET /v1/session`), which the operator's
//! `ArchiveReady` follows. Against moto: a bucket that exists, one that does not.

use cairn_agent::config::{ConfigFile, Storage, StorageSettings};
use cairn_sim::Sim;

use crate::support::agent::*;
use crate::support::moto::Moto;

fn storage(env: &[(String, String)]) -> Storage {
    let cfg = ConfigFile::parse(
        &config_yaml("probe", "http://127.0.0.1:9/v1", 100_000, ""),
        "test",
    )
    .expect("config");
    let lookup = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let settings = StorageSettings::from_spec(&cfg.spec, lookup).expect("settings");
    Storage::open(&settings, &cfg.namespace, &cfg.name).expect("storage")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_archive_check_proves_the_bucket_answers_or_says_why_not() {
    let moto = Moto::start().await;
    let dir = tempfile::tempdir().expect("tempdir");

    let env = storage_env(dir.path(), Some(&moto.endpoint));
    let check = storage(&env).check().await;
    assert!(check.ok, "{check:?}");
    assert_eq!(check.location, "s3://cairn-test/cairn/tests/probe/");
    assert_eq!(check.message, None);
    assert_eq!(check.credentials.as_deref(), Some("static keys"));

    let mut missing = env.clone();
    for (k, v) in &mut missing {
        if k == "CAIRN_S3_BUCKET" {
            *v = "no-such-bucket".into();
        }
    }
    let check = storage(&missing).check().await;
    assert!(!check.ok, "{check:?}");
    assert_eq!(check.location, "s3://no-such-bucket/cairn/tests/probe/");
    let message = check.message.unwrap_or_default();
    assert!(message.contains("NoSuchBucket"), "{message}");

    let local = storage(&storage_env(dir.path(), None)).check().await;
    assert!(local.ok, "{local:?}");
    assert!(local.location.starts_with("local:"), "{local:?}");
    assert_eq!(local.credentials, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_reports_its_archive_check_in_the_session_stats() {
    let moto = Moto::start().await;
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("checked.yaml");
    std::fs::write(
        &config,
        config_yaml("checked", &format!("{}/v1", sim.url()), 100_000, ""),
    )
    .expect("config");
    let env = storage_env(&dir.path().join("data"), Some(&moto.endpoint));
    let agent = AgentProcess::start(&config, &env, &dir.path().join("agent.log"));
    let session = agent.api().session().await;
    let check = &session["stats"]["archiveCheck"];
    assert_eq!(check["ok"], true, "{session}");
    assert_eq!(
        check["location"], "s3://cairn-test/cairn/tests/checked/",
        "{session}"
    );
}
