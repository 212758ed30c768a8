//! The session's pod: one Pod, owned by the session, running `cairn-agent serve`, hardened,
//! with its settings and credentials wired in as environment, and the token Secret it serves
//! with. The operator creates it itself (no StatefulSet in between): its fixed name keeps at
//! most one pod per session, and a change that needs a new process replaces it (see
//! `apply::ensure_pod`).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar,
    EnvVarSource, HTTPGetAction, KeyToPath, ObjectFieldSelector, Pod, PodSecurityContext, PodSpec,
    Probe, SeccompProfile, Secret, SecretKeySelector, SecretVolumeSource, SecurityContext, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;
use sha2::{Digest, Sha256};

use cairn_crds::ProviderKind;
use cairn_crds::names::{
    AGENT_PORT, SESSIONS, TOKEN_KEY, object_name, pod_name, token_secret_name,
};

use super::{ApiToken, BuildInputs, labels, meta};
use crate::config::{OTLP_HEADERS_KEY, OtlpExport};
use crate::validate::{ArchivePlan, Plan};

/// Pod annotation over everything whose change needs a new process. The policy is not part
/// of it: the agent watches its session and applies policy edits on the next turn.
pub const RESTART_HASH_ANNOTATION: &str = "cairn.dev/restart-hash";

/// The unprivileged user of distroless images.
const RUN_AS: i64 = 65532;
/// Where the pod's scratch volume holds the local archive cache (and the local journal
/// fallback through `XDG_DATA_HOME`).
const CACHE_DIR: &str = "/var/cache/cairn";
const SCRATCH_VOLUME: &str = "scratch";
/// `spec.systemPromptFrom` is mounted rather than read through the API: the kubelet keeps the
/// file current and the session's Role needs no access to ConfigMaps.
const PROMPT_VOLUME: &str = "system-prompt";
const PROMPT_DIR: &str = "/etc/cairn/system-prompt";
const PROMPT_FILE: &str = "system-prompt";
const CA_VOLUME: &str = "ca-bundle";
const CA_DIR: &str = "/etc/cairn/ca";
const CA_FILE: &str = "ca-bundle.pem";
/// Each `tools.mcpServers[].headersFrom` Secret is mounted (not read through the API) under
/// `MCP_HEADERS_DIR/<server>/`, one file per key: only this session's pod names the Secret,
/// and neither the session's Role nor the operator needs to read it.
const MCP_HEADERS_DIR: &str = "/var/run/cairn/mcp-headers";

/// The MCP servers with a headers Secret, each with the name of its volume.
fn mcp_header_volumes(plan: &Plan) -> Vec<(String, &str, &str)> {
    plan.spec
        .mcp_servers()
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            s.headers_from
                .as_deref()
                .map(|secret| (format!("mcp-headers-{i}"), s.name.as_str(), secret))
        })
        .collect()
}

pub(super) fn token_secret(plan: &Plan, token: &ApiToken) -> Secret {
    Secret {
        metadata: meta(plan, token_secret_name(&plan.name)),
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(
            TOKEN_KEY.to_string(),
            ByteString(token.expose().as_bytes().to_vec()),
        )])),
        ..Default::default()
    }
}

/// Environment variable the agent reads the provider credential from. Bedrock takes a
/// Bedrock API key (bearer token): the AWS key-pair variables already carry the S3 identity.
/// The variable the agent reads the summarizer's own API key from
/// (`summarizer.credentials`).
pub const SUMMARIZER_KEY_ENV: &str = "CAIRN_SUMMARIZER_API_KEY";

pub fn provider_key_env(kind: ProviderKind) -> &'static str {
    match kind {
        ProviderKind::Openai | ProviderKind::OpenaiResponses | ProviderKind::OpenaiCompatible => {
            "OPENAI_API_KEY"
        }
        ProviderKind::Anthropic => "ANTHROPIC_API_KEY",
        ProviderKind::Gemini => "GEMINI_API_KEY",
        ProviderKind::Bedrock => "AWS_BEARER_TOKEN_BEDROCK",
    }
}

/// What a restart depends on. Serialized with field names so that adding a field changes
/// every hash once, on purpose.
#[derive(Serialize)]
struct RestartInputs<'a> {
    image: &'a str,
    resources: &'a k8s_openapi::api::core::v1::ResourceRequirements,
    provider_secret: Option<&'a str>,
    s3_secret: Option<&'a str>,
    archive: ArchiveFields<'a>,
    /// Left out when unset, so that pods of an operator without span export keep the hash
    /// they had before the setting existed.
    #[serde(skip_serializing_if = "Option::is_none")]
    otlp: Option<OtlpFields<'a>>,
}

#[derive(Serialize)]
struct OtlpFields<'a> {
    endpoint: &'a str,
    headers_secret: Option<&'a str>,
    headers: Option<&'a str>,
    resource_attributes: Option<&'a str>,
}

#[derive(Serialize)]
struct ArchiveFields<'a> {
    endpoint: Option<&'a str>,
    bucket: Option<&'a str>,
    prefix: &'a str,
    region: &'a str,
    force_path_style: bool,
    credentials_secret: Option<&'a str>,
    local_cache_size: &'a str,
    ttl: &'a str,
}

/// Hash of everything whose change must replace the pod.
pub fn restart_hash(plan: &Plan, inputs: &BuildInputs) -> String {
    let a = &plan.archive;
    let fields = RestartInputs {
        image: &plan.image,
        resources: &plan.resources,
        provider_secret: inputs.provider_secret_digest.as_deref(),
        s3_secret: inputs.s3_secret_digest.as_deref(),
        archive: ArchiveFields {
            endpoint: a.endpoint.as_deref(),
            bucket: a.bucket.as_deref(),
            prefix: &a.prefix,
            region: &a.region,
            force_path_style: a.force_path_style,
            credentials_secret: a.credentials.as_ref().map(|c| c.secret_name.as_str()),
            local_cache_size: &a.local_cache_size,
            ttl: &a.ttl,
        },
        otlp: plan.otlp.as_ref().map(|o| OtlpFields {
            endpoint: &o.endpoint,
            headers_secret: o.headers_secret.as_deref(),
            headers: inputs.otlp_headers_digest.as_deref(),
            resource_attributes: o.resource_attributes.as_deref(),
        }),
    };
    // Serializing plain structs of strings and k8s types cannot fail; an empty input would
    // still hash deterministically.
    let bytes = serde_json::to_vec(&fields).unwrap_or_default();
    hex::encode(&Sha256::digest(&bytes)[..8])
}

/// The session's pod; `None` while the session is suspended (by hand or for being idle).
pub(super) fn pod(plan: &Plan, inputs: &BuildInputs) -> Option<Pod> {
    if plan.spec.suspend {
        return None;
    }
    let template = plan.spec.template.as_ref();
    let mut annotations = super::template::pod_annotations(plan);
    annotations.insert(
        RESTART_HASH_ANNOTATION.to_string(),
        restart_hash(plan, inputs),
    );

    let mut spec = PodSpec {
        service_account_name: Some(object_name(&plan.name)),
        // `cairn-NAME.cairn-sessions.NS.svc`: the namespace's shared headless Service gives
        // the pod its DNS name.
        hostname: Some(object_name(&plan.name)),
        subdomain: Some(SESSIONS.to_string()),
        automount_service_account_token: Some(true),
        enable_service_links: Some(false),
        restart_policy: Some("Always".into()),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(RUN_AS),
            run_as_group: Some(RUN_AS),
            fs_group: Some(RUN_AS),
            seccomp_profile: Some(runtime_default()),
            ..Default::default()
        }),
        containers: vec![agent_container(plan)],
        volumes: Some(volumes(plan)),
        node_selector: template.and_then(|t| t.node_selector.clone()),
        termination_grace_period_seconds: Some(i64::from(grace_seconds(plan))),
        ..Default::default()
    };
    super::template::apply_to_pod(plan, &mut spec);

    let mut metadata = meta(plan, pod_name(&plan.name));
    metadata.labels = Some(super::template::pod_labels(plan, labels(&plan.name)));
    metadata.annotations = Some(annotations);
    Some(Pod {
        metadata,
        spec: Some(spec),
        ..Default::default()
    })
}

fn volumes(plan: &Plan) -> Vec<Volume> {
    let mut volumes = vec![Volume {
        name: SCRATCH_VOLUME.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity(plan.archive.local_cache_size.clone())),
            ..Default::default()
        }),
        ..Default::default()
    }];
    if let Some(ca) = &plan.spec.provider.ca_bundle {
        let items = Some(vec![KeyToPath {
            key: ca.key.clone(),
            path: CA_FILE.into(),
            ..Default::default()
        }]);
        volumes.push(Volume {
            name: CA_VOLUME.into(),
            config_map: ca
                .config_map_name
                .as_ref()
                .map(|name| ConfigMapVolumeSource {
                    name: name.clone(),
                    items: items.clone(),
                    ..Default::default()
                }),
            secret: ca.secret_name.as_ref().map(|name| SecretVolumeSource {
                secret_name: Some(name.clone()),
                items: items.clone(),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    if let Some(prompt) = &plan.spec.system_prompt_from {
        volumes.push(Volume {
            name: PROMPT_VOLUME.into(),
            config_map: Some(ConfigMapVolumeSource {
                name: prompt.config_map_name.clone(),
                items: Some(vec![KeyToPath {
                    key: prompt.key.clone(),
                    path: PROMPT_FILE.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    for (volume, _, secret) in mcp_header_volumes(plan) {
        volumes.push(Volume {
            name: volume,
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.to_owned()),
                // Readable by the agent's group only (the pod's fsGroup).
                default_mode: Some(0o440),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    volumes.extend(crate::scoped::volume(plan));
    volumes
}

fn volume_mounts(plan: &Plan) -> Vec<VolumeMount> {
    let scratch = |path: &str, sub: &str| VolumeMount {
        name: SCRATCH_VOLUME.into(),
        mount_path: path.to_string(),
        sub_path: Some(sub.to_string()),
        ..Default::default()
    };
    let mut mounts = vec![scratch("/tmp", "tmp"), scratch(CACHE_DIR, "archive")];
    if plan.spec.provider.ca_bundle.is_some() {
        mounts.push(VolumeMount {
            name: CA_VOLUME.into(),
            mount_path: CA_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        });
    }
    if plan.spec.system_prompt_from.is_some() {
        mounts.push(VolumeMount {
            name: PROMPT_VOLUME.into(),
            mount_path: PROMPT_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        });
    }
    for (volume, server, _) in mcp_header_volumes(plan) {
        mounts.push(VolumeMount {
            name: volume,
            mount_path: format!("{MCP_HEADERS_DIR}/{server}"),
            read_only: Some(true),
            ..Default::default()
        });
    }
    mounts.extend(crate::scoped::volume_mount(plan));
    mounts
}

fn runtime_default() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".into(),
        ..Default::default()
    }
}

/// How long an agent may take to start (take its Lease, rebuild its history) before the
/// kubelet restarts it: longer than a Lease left behind by a lost pod takes to expire, plus
/// the rebuild of a long journal from a slow store.
const STARTUP_SECONDS: i32 = 600;

fn agent_container(plan: &Plan) -> Container {
    let session = format!("{}/{}", plan.namespace, plan.name);
    let probe = |path: &str, period: i32, failures: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_string()),
            port: IntOrString::String("http".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(2),
        failure_threshold: Some(failures),
        ..Default::default()
    };
    Container {
        name: "agent".into(),
        image: Some(plan.image.clone()),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(vec!["cairn-agent".into()]),
        args: Some(vec![
            "serve".into(),
            "--session".into(),
            session,
            "--listen".into(),
            format!("0.0.0.0:{AGENT_PORT}"),
        ]),
        ports: Some(vec![ContainerPort {
            name: Some("http".into()),
            container_port: i32::from(AGENT_PORT),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        env: Some(env(plan)),
        resources: Some(plan.resources.clone()),
        // Starting (the Lease taken, the history rebuilt from the journal) is polled every
        // second: the kubelet probes readiness the moment the startup probe passes, so a
        // started or woken session is Ready about a second after the agent is, not at the
        // next 10 s tick. Then liveness and readiness every 10 s.
        startup_probe: Some(probe("/readyz", 1, STARTUP_SECONDS)),
        liveness_probe: Some(probe("/healthz", 10, 3)),
        readiness_probe: Some(probe("/readyz", 10, 3)),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(RUN_AS),
            run_as_group: Some(RUN_AS),
            read_only_root_filesystem: Some(true),
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            seccomp_profile: Some(runtime_default()),
            ..Default::default()
        }),
        volume_mounts: Some(volume_mounts(plan)),
        ..Default::default()
    }
}

/// The pod's grace period: the agent is told the same number so it aborts a turn in
/// flight before the kubelet's SIGKILL.
fn grace_seconds(plan: &Plan) -> u32 {
    plan.spec
        .template
        .as_ref()
        .and_then(|t| t.termination_grace_period_seconds)
        .unwrap_or(cairn_crds::session::DEFAULT_TERMINATION_GRACE_SECONDS)
}

fn env(plan: &Plan) -> Vec<EnvVar> {
    let mut env = vec![
        value("CAIRN_SESSION", format!("{}/{}", plan.namespace, plan.name)),
        // Part of the agent's holder identity: a replacement pod has the pod's name but
        // not its UID.
        EnvVar {
            name: "CAIRN_POD_UID".into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "metadata.uid".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        },
        value(
            "CAIRN_TERMINATION_GRACE_SECONDS",
            grace_seconds(plan).to_string(),
        ),
        secret_ref(
            "CAIRN_API_TOKEN",
            &token_secret_name(&plan.name),
            TOKEN_KEY,
            false,
        ),
    ];
    let provider = &plan.spec.provider;
    if let Some(creds) = &provider.credentials {
        env.push(secret_ref(
            provider_key_env(provider.kind),
            &creds.secret_name,
            &creds.key,
            false,
        ));
    }
    // The summarizer's own provider key (its Secret is in the session's namespace, like the
    // provider's), read by the agent as CAIRN_SUMMARIZER_API_KEY.
    if let Some(creds) = &plan.policy.summarizer.credentials {
        env.push(secret_ref(
            SUMMARIZER_KEY_ENV,
            &creds.secret_name,
            &creds.key,
            false,
        ));
    }
    if provider.kind == ProviderKind::Bedrock
        && let Some(region) = &provider.region
    {
        env.push(value("AWS_REGION", region.clone()));
    }
    env.extend(archive_env(&plan.archive));
    env.extend(crate::scoped::env(plan));
    env.extend([
        value("CAIRN_CACHE_DIR", CACHE_DIR.to_string()),
        value("XDG_DATA_HOME", CACHE_DIR.to_string()),
        value("HOME", "/tmp".to_string()),
    ]);
    if plan.spec.system_prompt_from.is_some() {
        env.push(value(
            "CAIRN_SYSTEM_PROMPT_FILE",
            format!("{PROMPT_DIR}/{PROMPT_FILE}"),
        ));
    }
    for s in plan
        .spec
        .mcp_servers()
        .iter()
        .filter(|s| s.headers_from.is_some())
    {
        env.push(value(
            &s.headers_dir_env(),
            format!("{MCP_HEADERS_DIR}/{}", s.name),
        ));
    }
    if let Some(otlp) = &plan.otlp {
        env.extend(otlp_env(otlp));
    }
    if let Some(prices) = &plan.price_table {
        env.push(value("CAIRN_PRICE_TABLE", prices.clone()));
    }
    env.extend(network_env(plan));
    // The session's own variables; the proxy ones went into the network path above.
    env.extend(
        template_env(plan)
            .filter(|e| !PROXY_VARS.contains(&e.name.as_str()))
            .cloned(),
    );
    env
}

/// The proxy variables, which `template.proxy`, `template.env` and the fleet all set.
const PROXY_VARS: [&str; 3] = ["HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY"];

/// `spec.template.env`.
fn template_env(plan: &Plan) -> impl Iterator<Item = &EnvVar> {
    plan.spec
        .template
        .as_ref()
        .and_then(|t| t.env.as_ref())
        .into_iter()
        .flatten()
}

/// The agent's proxies (the session's `template.proxy` field by field over the fleet's) and
/// trusted CAs (the fleet's PEM inline, the session's bundle as a mounted file).
fn network_env(plan: &Plan) -> Vec<EnvVar> {
    let fleet = &plan.network;
    let session = plan.spec.template.as_ref().and_then(|t| t.proxy.as_ref());
    let mut env = Vec::new();
    // `template.proxy`, else the session's `template.env` entry, else the fleet's.
    for (name, own, fleet) in [
        (
            PROXY_VARS[0],
            session.and_then(|p| p.https_proxy.as_ref()),
            &fleet.https_proxy,
        ),
        (
            PROXY_VARS[1],
            session.and_then(|p| p.http_proxy.as_ref()),
            &fleet.http_proxy,
        ),
        (
            PROXY_VARS[2],
            session.and_then(|p| p.no_proxy.as_ref()),
            &fleet.no_proxy,
        ),
    ] {
        if let Some(v) = own {
            env.push(value(name, v.clone()));
        } else if let Some(e) = template_env(plan).find(|e| e.name == name) {
            env.push(e.clone());
        } else if let Some(v) = fleet {
            env.push(value(name, v.clone()));
        }
    }
    if let Some(pem) = &fleet.ca_bundle {
        env.push(value("CAIRN_CA_BUNDLE_PEM", pem.clone()));
    }
    if plan.spec.provider.ca_bundle.is_some() {
        env.push(value("CAIRN_CA_BUNDLE", format!("{CA_DIR}/{CA_FILE}")));
    }
    env
}

/// The standard OpenTelemetry variables the agent's exporter reads.
fn otlp_env(o: &OtlpExport) -> Vec<EnvVar> {
    let mut env = vec![value("OTEL_EXPORTER_OTLP_ENDPOINT", o.endpoint.clone())];
    if let Some(secret) = &o.headers_secret {
        // Optional: a namespace without the Secret still runs its sessions, exporting without
        // the headers; creating the Secret later rolls the pod through the restart hash.
        env.push(secret_ref(
            "OTEL_EXPORTER_OTLP_HEADERS",
            secret,
            OTLP_HEADERS_KEY,
            true,
        ));
    }
    if let Some(attributes) = &o.resource_attributes {
        env.push(value("OTEL_RESOURCE_ATTRIBUTES", attributes.clone()));
    }
    env
}

fn archive_env(a: &ArchivePlan) -> Vec<EnvVar> {
    let mut env = Vec::new();
    if let Some(endpoint) = &a.endpoint {
        env.push(value("CAIRN_S3_ENDPOINT", endpoint.clone()));
    }
    if let Some(bucket) = &a.bucket {
        env.push(value("CAIRN_S3_BUCKET", bucket.clone()));
    }
    env.extend([
        value("CAIRN_S3_PREFIX", a.prefix.clone()),
        value("CAIRN_S3_REGION", a.region.clone()),
        value("CAIRN_S3_FORCE_PATH_STYLE", a.force_path_style.to_string()),
        value("CAIRN_ARCHIVE_CACHE_SIZE", a.local_cache_size.clone()),
        value("CAIRN_ARCHIVE_TTL", a.ttl.clone()),
    ]);
    // The archive's own names, so that the standard AWS_* variables (and the default chain
    // they feed) stay free for another identity, e.g. Bedrock's.
    if let Some(creds) = &a.credentials {
        env.push(secret_ref(
            "CAIRN_S3_ACCESS_KEY_ID",
            &creds.secret_name,
            &creds.access_key_id_key,
            false,
        ));
        env.push(secret_ref(
            "CAIRN_S3_SECRET_ACCESS_KEY",
            &creds.secret_name,
            &creds.secret_access_key_key,
            false,
        ));
    }
    env
}

fn value(name: &str, value: String) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: Some(value),
        ..Default::default()
    }
}

fn secret_ref(name: &str, secret: &str, key: &str, optional: bool) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.to_string(),
                key: key.to_string(),
                optional: Some(optional),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}
