//! The finalizer's S3 purge against a real S3-compatible server (moto, started by the test
//! through the harness; install it with `pip install 'moto[server]'`).

use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::primitives::ByteStream;
use cairn_operator::purge::{ArchivePurger, PurgeError, PurgeTarget, S3Keys, S3Purger};
use cairn_tests::harness::S3Server;

/// The harness's moto server, stopped on drop (also when the test process dies).
struct Moto {
    endpoint: String,
    _server: S3Server,
    _logs: tempfile::TempDir,
}

fn start_moto() -> Moto {
    let logs = tempfile::tempdir().expect("log dir");
    let server = S3Server::start(logs.path(), &[])
        .unwrap_or_else(|e| panic!("{e} (these tests need moto: pip install 'moto[server]')"));
    Moto {
        endpoint: server.endpoint.clone(),
        _server: server,
        _logs: logs,
    }
}

fn keys() -> S3Keys {
    S3Keys {
        access_key_id: "testing".into(),
        secret_access_key: "testing".into(),
    }
}

fn client(endpoint: &str) -> aws_sdk_s3::Client {
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .http_client(cairn_operator::purge::s3_http_client())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .force_path_style(true)
        .credentials_provider(Credentials::new("testing", "testing", None, None, "test"))
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

async fn put(c: &aws_sdk_s3::Client, key: &str) {
    c.put_object()
        .bucket("archive")
        .key(key)
        .body(ByteStream::from(key.as_bytes().to_vec()))
        .send()
        .await
        .expect("put object");
}

async fn list(c: &aws_sdk_s3::Client) -> Vec<String> {
    let mut out = Vec::new();
    let mut token = None;
    loop {
        let page = c
            .list_objects_v2()
            .bucket("archive")
            .set_continuation_token(token)
            .send()
            .await
            .expect("list");
        out.extend(
            page.contents()
                .iter()
                .filter_map(|o| o.key().map(String::from)),
        );
        match page.next_continuation_token() {
            Some(t) => token = Some(t.to_string()),
            None => break,
        }
    }
    out.sort();
    out
}

fn target(endpoint: &str, prefix: &str) -> PurgeTarget {
    PurgeTarget {
        endpoint: Some(endpoint.into()),
        bucket: "archive".into(),
        region: "us-east-1".into(),
        force_path_style: true,
        prefix: prefix.into(),
        credentials: Some(keys()),
    }
}

#[tokio::test]
async fn purge_deletes_exactly_the_session_prefix_and_is_idempotent() {
    let moto = start_moto();
    let c = client(&moto.endpoint);
    c.create_bucket()
        .bucket("archive")
        .send()
        .await
        .expect("bucket");

    // More than one DeleteObjects batch for the doomed session.
    for i in 0..1203 {
        put(&c, &format!("cairn/team-a/chat/ccr/{i:05}")).await;
    }
    put(&c, "cairn/team-a/chat/journal/000001.jsonl").await;
    // Neighbours that share a string prefix or a namespace must survive.
    put(&c, "cairn/team-a/chatty/ccr/k1").await;
    put(&c, "cairn/team-a/other/journal/000001.jsonl").await;
    put(&c, "cairn/team-b/chat/ccr/k1").await;

    let purger = S3Purger;
    let deleted = purger
        .purge(&target(&moto.endpoint, "cairn/team-a/chat/"))
        .await
        .expect("purge");
    assert_eq!(deleted, 1204);
    assert_eq!(
        list(&c).await,
        [
            "cairn/team-a/chatty/ccr/k1",
            "cairn/team-a/other/journal/000001.jsonl",
            "cairn/team-b/chat/ccr/k1",
        ]
    );

    let again = purger
        .purge(&target(&moto.endpoint, "cairn/team-a/chat/"))
        .await
        .expect("second purge");
    assert_eq!(
        again, 0,
        "purging an empty prefix succeeds and deletes nothing"
    );
}

#[tokio::test]
async fn purge_refuses_prefixes_wider_than_one_session() {
    // No server needed: the guard runs before any request.
    for prefix in ["", "/", "cairn/", "team-a/", "cairn/team-a/chat"] {
        let err = S3Purger
            .purge(&target("http://127.0.0.1:9", prefix))
            .await
            .expect_err("must refuse");
        assert!(
            matches!(err, PurgeError::UnsafePrefix(_)),
            "{prefix}: {err}"
        );
    }
}

#[tokio::test]
async fn purge_failures_are_reported_not_swallowed() {
    let moto = start_moto();
    // The bucket does not exist.
    let err = S3Purger
        .purge(&target(&moto.endpoint, "cairn/team-a/chat/"))
        .await
        .expect_err("missing bucket");
    assert_eq!(err.label(), "PurgeListFailed");
    assert!(err.to_string().contains("NoSuchBucket"), "{err}");
}
