//! The provider client for an AgentSession's `spec.provider`: the client of its kind, with
//! the endpoint, credentials and options of `config`.

use cairn_crds::{ProviderKind, ProviderSpec};

use super::bedrock::{Bedrock, BedrockAuth};
use super::config::{BuildError, ClientOptions, Credentials, default_base_url};
use super::{Anthropic, Gemini, OpenAiChat, OpenAiResponses, Provider};
use crate::aws::AwsIdentity;

/// Builds the client for `spec` (one HTTP client per provider instance).
pub fn build(
    spec: &ProviderSpec,
    credentials: Credentials,
    options: ClientOptions,
) -> Result<Box<dyn Provider>, BuildError> {
    let base = match &spec.base_url {
        Some(u) => u.clone(),
        None => default_base_url(spec.kind, spec.region.as_deref()).ok_or(match spec.kind {
            ProviderKind::Bedrock => BuildError::MissingRegion,
            _ => BuildError::BaseUrl("openai-compatible needs provider.baseUrl".into()),
        })?,
    };
    if !(base.starts_with("http://") || base.starts_with("https://")) {
        return Err(BuildError::BaseUrl(
            "must start with http:// or https://".into(),
        ));
    }
    let base = base.trim_end_matches('/').to_string();
    let need_key = |kind: &'static str, var: &str| {
        credentials
            .api_key
            .clone()
            .ok_or_else(|| BuildError::MissingCredentials {
                kind,
                hint: format!("set provider.credentials or {var}"),
            })
    };
    Ok(match spec.kind {
        ProviderKind::Openai => Box::new(OpenAiChat::new(
            "openai",
            base,
            Some(need_key("openai", "OPENAI_API_KEY")?),
            false,
            options,
        )?),
        ProviderKind::OpenaiCompatible => Box::new(OpenAiChat::new(
            "openai-compatible",
            base,
            credentials.api_key,
            true,
            options,
        )?),
        ProviderKind::OpenaiResponses => Box::new(OpenAiResponses::new(
            base,
            need_key("openai-responses", "OPENAI_API_KEY")?,
            options,
        )?),
        ProviderKind::Anthropic => Box::new(Anthropic::new(
            base,
            need_key("anthropic", "ANTHROPIC_API_KEY")?,
            options,
        )?),
        ProviderKind::Gemini => Box::new(Gemini::new(
            base,
            need_key("gemini", "GEMINI_API_KEY")?,
            options,
        )?),
        ProviderKind::Bedrock => {
            let region = spec.region.clone().ok_or(BuildError::MissingRegion)?;
            let auth = match (credentials.api_key, credentials.aws) {
                (Some(key), _) => BedrockAuth::ApiKey(key),
                (None, aws) => {
                    BedrockAuth::sigv4(&aws.unwrap_or(AwsIdentity::Chain), &region, &options.net)
                }
            };
            Box::new(Bedrock::new(base, region, auth, options)?)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_reports_missing_pieces() {
        let spec = |kind, region: Option<&str>| ProviderSpec {
            kind,
            model: "m".into(),
            base_url: None,
            credentials: None,
            region: region.map(str::to_string),
            ca_bundle: None,
        };
        let e = build(
            &spec(ProviderKind::Anthropic, None),
            Credentials::default(),
            ClientOptions::default(),
        )
        .err()
        .map(|e| e.label());
        assert_eq!(e, Some("missing_credentials"));
        let e = build(
            &spec(ProviderKind::Bedrock, None),
            Credentials::api_key("k"),
            ClientOptions::default(),
        )
        .err()
        .map(|e| e.label());
        assert_eq!(e, Some("missing_region"));
        let e = build(
            &spec(ProviderKind::OpenaiCompatible, None),
            Credentials::default(),
            ClientOptions::default(),
        )
        .err()
        .map(|e| e.label());
        assert_eq!(e, Some("bad_base_url"));
        // Nothing named: Bedrock falls through to the default chain instead of failing.
        let chain = build(
            &spec(ProviderKind::Bedrock, Some("eu-west-1")),
            Credentials::default(),
            ClientOptions::default(),
        );
        assert!(chain.is_ok(), "bedrock without keys builds");
        let auth = BedrockAuth::sigv4(&AwsIdentity::Chain, "eu-west-1", &Default::default());
        assert!(format!("{auth:?}").contains("LazyChain"), "{auth:?}");
        let p = build(
            &spec(ProviderKind::Bedrock, Some("eu-west-1")),
            Credentials::api_key("k"),
            ClientOptions::default(),
        );
        assert_eq!(
            p.map(|p| p.name().to_string()).ok().as_deref(),
            Some("bedrock")
        );
    }
}
