//! The agent's AWS identities against real servers: moto (STS AssumeRoleWithWebIdentity,
//! IAM, and S3 with its IAM authentication enforced, so that only keys moto issued and has
//! not revoked are accepted and every signature is checked) and cairn-sim's Bedrock endpoint
//! (which checks SigV4 signatures itself).
//!
//! One test: the default chain reads the process environment, which is set once before the
//! runtime starts.

use std::path::Path;
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials as AwsKeys;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use cairn_agent::aws::{self, AwsIdentity, CachedCredentials, DirectoryCredentials};
use cairn_agent::ccr::{S3Config, S3Store, SessionScope, Store};
use cairn_agent::history::Message;
use cairn_agent::provider::{ChatRequest, ClientOptions, Credentials, RetryPolicy, build};
use cairn_crds::{ProviderKind, ProviderSpec};
use cairn_sim::Sim;

use crate::support::moto::Moto;

const ROLE: &str = "cairn-agent";
const ROLE_ARN: &str = "arn:aws:iam::123456789012:role/cairn-agent";
const USER: &str = "cairn-rotating";
const ALLOW_ALL: &str =
    r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*"}]}"#;
const TRUST: &str = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Federated":"cairn"},"Action":"sts:AssumeRoleWithWebIdentity"}]}"#;

/// A signed IAM Query API call to moto; the body of its answer.
async fn iam(moto: &Moto, keys: &AwsKeys, params: &[(&str, &str)]) -> String {
    // Encoded as moto re-encodes the form before checking the signature over it.
    const FORM: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    let enc = |s: &str| percent_encoding::utf8_percent_encode(s, FORM).to_string();
    let body = params
        .iter()
        .chain(&[("Version", "2010-05-08")])
        .map(|(k, v)| format!("{k}={}", enc(v)))
        .collect::<Vec<_>>()
        .join("&");
    let url = format!("{}/", moto.endpoint);
    let ct = "application/x-www-form-urlencoded; charset=utf-8";
    let identity = keys.clone().into();
    let params_v4 = v4::SigningParams::builder()
        .identity(&identity)
        .region("us-east-1")
        .name("iam")
        .time(SystemTime::now())
        .settings(SigningSettings::default())
        .build()
        .unwrap()
        .into();
    let req = SignableRequest::new(
        "POST",
        &url,
        [("content-type", ct)].into_iter(),
        SignableBody::Bytes(body.as_bytes()),
    )
    .unwrap();
    let (instructions, _) = sign(req, &params_v4).unwrap().into_parts();
    let mut r = reqwest::Client::new()
        .post(&url)
        .header("content-type", ct)
        .body(body.clone());
    for (k, v) in instructions.headers() {
        r = r.header(k, v);
    }
    let resp = r.send().await.unwrap();
    let status = resp.status();
    let text = resp.text().await.unwrap();
    assert!(status.is_success(), "IAM {params:?}: {status} {text}");
    text
}

fn xml_field(xml: &str, name: &str) -> String {
    let open = format!("<{name}>");
    let start = xml.find(&open).map(|i| i + open.len()).expect(name);
    let end = xml[start..].find(&format!("</{name}>")).expect(name) + start;
    xml[start..end].to_string()
}

async fn access_key(moto: &Moto, admin: &AwsKeys) -> AwsKeys {
    let xml = iam(
        moto,
        admin,
        &[("Action", "CreateAccessKey"), ("UserName", USER)],
    )
    .await;
    AwsKeys::new(
        xml_field(&xml, "AccessKeyId"),
        xml_field(&xml, "SecretAccessKey"),
        None,
        None,
        "test",
    )
}

/// Sets moto to authenticate every action after the next `free` ones.
async fn enforce_auth_after(moto: &Moto, free: u32) {
    let r = reqwest::Client::new()
        .post(format!("{}/moto-api/reset-auth", moto.endpoint))
        .body(free.to_string())
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "reset-auth: {}", r.status());
}

fn store(moto: &Moto, identity: AwsIdentity, session: &str) -> S3Store {
    let config = S3Config {
        credentials: identity,
        ..moto.config()
    };
    S3Store::new(
        &config,
        SessionScope::new("cairn", "team-a", session).unwrap(),
    )
    .unwrap()
}

async fn round_trip(store: &S3Store, content: &str) -> Result<(), String> {
    let key = store
        .archive(content.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let back = store.fetch(&key).await.map_err(|e| e.to_string())?;
    assert_eq!(back.as_deref(), Some(content.as_bytes()));
    Ok(())
}

/// A Secret volume as the kubelet lays it out: the keys are links into `..data`, which links
/// to a timestamped directory and is swapped in one rename.
fn publish(dir: &Path, generation: u32, keys: &AwsKeys, expires: Option<SystemTime>) {
    let stamped = format!("..gen{generation}");
    let target = dir.join(&stamped);
    std::fs::create_dir(&target).unwrap();
    let mut files = vec![
        (aws::ACCESS_KEY_ID_KEY, keys.access_key_id().to_string()),
        (
            aws::SECRET_ACCESS_KEY_KEY,
            keys.secret_access_key().to_string(),
        ),
    ];
    if let Some(at) = expires {
        files.push((
            aws::EXPIRATION_KEY,
            aws_smithy_types::DateTime::from(at)
                .fmt(aws_smithy_types::date_time::Format::DateTime)
                .unwrap(),
        ));
    }
    for (name, value) in &files {
        std::fs::write(target.join(name), value).unwrap();
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{name}"), &link).unwrap();
        }
    }
    let staging = dir.join("..data_tmp");
    std::os::unix::fs::symlink(&stamped, &staging).unwrap();
    std::fs::rename(&staging, dir.join("..data")).unwrap();
}

#[test]
fn aws_identities_against_moto_and_the_simulator() {
    // The test sets the AWS variables of the default chain: in a process of its own, where no
    // other test of this binary reads or changes the environment meanwhile.
    if !crate::support::in_own_process(
        module_path!(),
        "aws_identities_against_moto_and_the_simulator",
    ) {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let token = scratch.path().join("token");
    std::fs::write(&token, "a-projected-service-account-token").unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let moto = rt.block_on(Moto::start());
    // SAFETY: no other thread reads the environment yet (the only test in this process; the
    // runtime's workers are idle and moto is a child process).
    unsafe {
        for k in [
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "AWS_PROFILE",
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        ] {
            std::env::remove_var(k);
        }
        std::env::set_var("AWS_CONFIG_FILE", scratch.path().join("none"));
        std::env::set_var("AWS_SHARED_CREDENTIALS_FILE", scratch.path().join("none"));
        std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
        std::env::set_var("AWS_WEB_IDENTITY_TOKEN_FILE", &token);
        std::env::set_var("AWS_ROLE_ARN", ROLE_ARN);
        std::env::set_var("AWS_ROLE_SESSION_NAME", "cairn-test");
        std::env::set_var("AWS_ENDPOINT_URL_STS", &moto.endpoint);
    }
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(120), scenarios(&moto, scratch.path()))
            .await
            .expect("the scenarios finish in time");
    });
}

async fn scenarios(moto: &Moto, scratch: &Path) {
    // Set-up while moto does not authenticate yet (any signature routes the call to IAM).
    let setup = AwsKeys::new("setup", "setup", None, None, "test");
    iam(
        moto,
        &setup,
        &[
            ("Action", "CreateRole"),
            ("RoleName", ROLE),
            ("AssumeRolePolicyDocument", TRUST),
        ],
    )
    .await;
    iam(
        moto,
        &setup,
        &[
            ("Action", "PutRolePolicy"),
            ("RoleName", ROLE),
            ("PolicyName", "all"),
            ("PolicyDocument", ALLOW_ALL),
        ],
    )
    .await;
    iam(
        moto,
        &setup,
        &[("Action", "CreateUser"), ("UserName", USER)],
    )
    .await;
    iam(
        moto,
        &setup,
        &[
            ("Action", "PutUserPolicy"),
            ("UserName", USER),
            ("PolicyName", "all"),
            ("PolicyDocument", ALLOW_ALL),
        ],
    )
    .await;
    let set1 = access_key(moto, &setup).await;
    let set2 = access_key(moto, &setup).await;

    bedrock_signs_with_the_chains_session_token().await;
    bedrock_follows_a_rotating_directory(scratch).await;
    s3_through_web_identity(moto).await;
    s3_keys_rotate_in_a_directory(moto, scratch, &set1, &set2).await;
}

/// (c) The chain's web identity yields temporary keys with a session token; Bedrock's
/// requests carry and sign the token, and the simulator finds the signature valid.
async fn bedrock_signs_with_the_chains_session_token() {
    let sim = Sim::start().await.unwrap();
    let chain =
        AwsIdentity::Chain.provider("test", "us-east-1", aws::http_client(&Default::default()));
    let shared = SharedCredentialsProvider::new(CachedCredentials::new(chain));
    let keys = shared.provide_credentials().await.expect("STS answers");
    assert!(keys.access_key_id().starts_with("ASIA"), "{keys:?}");
    assert!(keys.session_token().is_some());
    sim.add_aws_key(keys.access_key_id(), keys.secret_access_key());
    let spec = ProviderSpec {
        kind: ProviderKind::Bedrock,
        model: "us.anthropic.claude-sonnet-4-5-20250929-v1:0".into(),
        base_url: Some(sim.url()),
        credentials: None,
        region: Some("us-east-1".into()),
        ca_bundle: None,
    };
    let credentials = Credentials {
        api_key: None,
        aws: Some(AwsIdentity::Provider(shared)),
    };
    let options = ClientOptions {
        retry: RetryPolicy::none(),
        ..ClientOptions::default()
    };
    let p = build(&spec, credentials, options).unwrap();
    for stream in [false, true] {
        let req = ChatRequest {
            model: spec.model.clone(),
            messages: vec![Message::user("hi")],
            tools: vec![],
            max_output_tokens: 64,
            stream,
            controls: Default::default(),
            context: None,
        };
        p.send(&req).await.expect("bedrock answers");
        let seen = sim.requests().pop().unwrap();
        let sig = seen.sigv4.expect("SigV4");
        assert_eq!(sig.access_key_id, keys.access_key_id());
        assert!(sig.session_token, "the session token is signed");
        assert_eq!(sig.verdict, "valid", "stream={stream}");
        assert_eq!(seen.outcome, "ok");
    }
}

/// Bedrock's identity from a credentials directory follows the directory's swap with no
/// new client: the simulator sees (and verifies) the new key on the next call.
async fn bedrock_follows_a_rotating_directory(scratch: &Path) {
    let sim = Sim::start().await.unwrap();
    let dir = scratch.join("bedrock-credentials");
    std::fs::create_dir(&dir).unwrap();
    let a = AwsKeys::new("AKIAROTATEA", "secret-a", None, None, "test");
    let b = AwsKeys::new("AKIAROTATEB", "secret-b", None, None, "test");
    sim.add_aws_key(a.access_key_id(), a.secret_access_key());
    sim.add_aws_key(b.access_key_id(), b.secret_access_key());
    publish(&dir, 1, &a, None);
    let spec = ProviderSpec {
        kind: ProviderKind::Bedrock,
        model: "anthropic.claude-3-haiku-20240307-v1:0".into(),
        base_url: Some(sim.url()),
        credentials: None,
        region: Some("us-east-1".into()),
        ca_bundle: None,
    };
    // Looked at again on every call (the default is a minute).
    let identity = DirectoryCredentials::new(&dir).with_recheck(Duration::from_secs(1));
    let credentials = Credentials {
        api_key: None,
        aws: Some(AwsIdentity::Directory(identity)),
    };
    let options = ClientOptions {
        retry: RetryPolicy::none(),
        ..ClientOptions::default()
    };
    let p = build(&spec, credentials, options).unwrap();
    let req = ChatRequest {
        model: spec.model.clone(),
        messages: vec![Message::user("hi")],
        tools: vec![],
        max_output_tokens: 64,
        stream: false,
        controls: Default::default(),
        context: None,
    };
    for keys in [&a, &b] {
        if keys.access_key_id() == b.access_key_id() {
            publish(&dir, 2, &b, None);
        }
        p.send(&req).await.expect("bedrock answers");
        let sig = sim.requests().pop().unwrap().sigv4.expect("SigV4");
        assert_eq!(sig.access_key_id, keys.access_key_id());
        assert_eq!(sig.verdict, "valid");
    }
}

/// (a) No keys named: the archive client takes the default chain, which assumes the role
/// through STS with the web identity token; moto then authenticates every S3 request, so
/// only the keys its STS issued can have written and read the object.
async fn s3_through_web_identity(moto: &Moto) {
    // The next action (AssumeRoleWithWebIdentity, unsigned like any such call) is the last
    // one moto lets through without checking keys and signature.
    enforce_auth_after(moto, 1).await;
    let s = store(moto, AwsIdentity::Chain, "web-identity");
    round_trip(&s, "archived through STS credentials")
        .await
        .expect("S3 with the role's temporary keys");
    let unknown = store(
        moto,
        AwsIdentity::fixed("AKIAUNKNOWN", "nope", None),
        "web-identity",
    );
    let refused = round_trip(&unknown, "x").await;
    assert!(refused.is_err(), "moto refuses keys it did not issue");
}

/// (b) Keys in a mounted directory rotate without a new client: set 1 is used, the
/// directory is swapped to set 2 and set 1 revoked in moto; once set 1's short expiration
/// comes near, the same store's next operation reads set 2.
async fn s3_keys_rotate_in_a_directory(
    moto: &Moto,
    scratch: &Path,
    set1: &AwsKeys,
    set2: &AwsKeys,
) {
    let dir = scratch.join("s3-credentials");
    std::fs::create_dir(&dir).unwrap();
    let expires = SystemTime::now() + Duration::from_secs(15);
    publish(&dir, 1, set1, Some(expires));
    let s = store(
        moto,
        AwsIdentity::Directory(DirectoryCredentials::new(&dir)),
        "rotating",
    );
    round_trip(&s, "written with set 1").await.expect("set 1");
    publish(&dir, 2, set2, None);
    iam(
        moto,
        set2,
        &[
            ("Action", "DeleteAccessKey"),
            ("UserName", USER),
            ("AccessKeyId", set1.access_key_id()),
        ],
    )
    .await;
    let revoked = store(
        moto,
        AwsIdentity::fixed(set1.access_key_id(), set1.secret_access_key(), None),
        "rotating",
    );
    assert!(round_trip(&revoked, "x").await.is_err(), "set 1 is revoked");
    // The client's identity cache asks again within its 10 s (jittered) buffer before
    // set 1's expiration.
    let wait = expires
        .duration_since(SystemTime::now())
        .unwrap_or_default()
        .saturating_sub(Duration::from_secs(4));
    tokio::time::sleep(wait).await;
    round_trip(&s, "written with set 2")
        .await
        .expect("the same store reads set 2 from the swapped directory");
}
