//! Cost of the pure part of a reconcile (validate + build + restart hash + status) for a
//! fully specified session: what the operator spends per reconcile before any API call.

use cairn_crds::AgentSession;
use cairn_operator::objects::{ApiToken, BuildInputs, build};
use cairn_operator::status::{self, Observed};
use cairn_operator::{Defaults, validate};
use criterion::{Criterion, black_box, criterion_group, criterion_main};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

const FULL: &str = r#"
provider: {kind: anthropic, model: claude-sonnet-4-5, credentials: {secretName: key}}
payloadCap: 5MB
policyRef: {name: frugal}
compaction: {budgetRatio: 0.5, microcompact: {truncateAfterTurns: 2}}
archive: {bucket: b, endpoint: 'http://s3:9000', credentials: {secretName: s3}, retainOnDelete: false}
template:
  image: registry.local/cairn-agent:2.0
  resources: {requests: {cpu: 250m, memory: 512Mi}, limits: {memory: 2Gi}}
"#;

fn session() -> AgentSession {
    let mut s = AgentSession::new(
        "research",
        serde_yaml::from_str(FULL).expect("fixture parses"),
    );
    s.metadata.namespace = Some("team-a".into());
    s.metadata.uid = Some("uid-1".into());
    s.metadata.generation = Some(1);
    s
}

fn bench(c: &mut Criterion) {
    let session = session();
    let policy = serde_yaml::from_str("budgetRatio: 0.4").expect("policy parses");
    let defaults = Defaults::default();
    let inputs = BuildInputs {
        api_token: ApiToken::from_existing("t".repeat(64)),
        provider_secret_digest: Some("p".into()),
        s3_secret_digest: Some("s".into()),
        otlp_headers_digest: None,
    };
    let now = Time(Timestamp::UNIX_EPOCH);
    c.bench_function("validate+build full session", |b| {
        b.iter(|| {
            let plan = validate(black_box(&session), Some(&policy), &defaults).expect("valid");
            black_box(build(&plan, &inputs))
        })
    });
    c.bench_function("status desired+transitions", |b| {
        let obs = Observed {
            name: "research".into(),
            namespace: "team-a".into(),
            generation: Some(1),
            suspended: false,
            policy: Ok("abc".into()),
            blocker: None,
            ready_pods: Some(1),
            api_token_hash: None,
            archive: Ok("s3://b/cairn/team-a/research/".into()),
            idle: None,
            archive_credentials: None,
        };
        let prev = status::desired(None, &obs, &now);
        b.iter(|| {
            let next = status::desired(Some(black_box(&prev)), &obs, &now);
            black_box(status::transitions(Some(&prev), &next))
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
