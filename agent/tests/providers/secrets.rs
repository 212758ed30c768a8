//! Credentials never reach logs, traces, errors or Debug output, whatever the call's fate,
//! with every library's tracing at its most verbose.

use std::io::Write;
use std::sync::{Arc, Mutex};

use cairn_agent::aws::AwsIdentity;
use cairn_agent::history::Message;
use cairn_agent::provider::{ChatRequest, ClientOptions, Credentials, RetryPolicy, Secret, build};
use cairn_crds::{ProviderKind, ProviderSpec};
use cairn_sim::{Fault, ScriptedReply, Sim};

const KEY: &str = "sk-live-DO-NOT-LEAK-1234";
const AWS_SECRET: &str = "aws-secret-DO-NOT-LEAK";
const AWS_TOKEN: &str = "aws-session-DO-NOT-LEAK";

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn no_secret_in_traces_errors_or_debug() {
    let captured = Captured::default();
    let writer = captured.clone();
    // Global, so `log` records (reqwest, hyper-util) are bridged in too.
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .try_init()
        .unwrap();

    let sim = Sim::start().await.unwrap();
    let mut shown = String::new();
    for kind in [
        ProviderKind::Openai,
        ProviderKind::OpenaiResponses,
        ProviderKind::Anthropic,
        ProviderKind::Gemini,
        ProviderKind::Bedrock,
    ] {
        let base = match kind {
            ProviderKind::Openai | ProviderKind::OpenaiResponses => format!("{}/v1", sim.url()),
            _ => sim.url(),
        };
        let spec = ProviderSpec {
            kind,
            model: "m".into(),
            base_url: Some(base),
            credentials: None,
            region: Some("us-east-1".into()),
            ca_bundle: None,
        };
        let credentials = Credentials {
            api_key: (kind != ProviderKind::Bedrock).then(|| Secret::new(KEY)),
            aws: Some(AwsIdentity::fixed(
                "AKIDEXAMPLE",
                AWS_SECRET,
                Some(AWS_TOKEN.into()),
            )),
        };
        shown.push_str(&format!("{credentials:?}"));
        let options = ClientOptions {
            retry: RetryPolicy {
                max_retries: 1,
                base: std::time::Duration::from_millis(1),
                ..RetryPolicy::default()
            },
            ..ClientOptions::default()
        };
        let p = build(&spec, credentials, options).unwrap();
        for stream in [false, true] {
            let req = ChatRequest {
                model: "m".into(),
                messages: vec![Message::user("hi")],
                tools: vec![],
                max_output_tokens: 10,
                stream,
                controls: Default::default(),
                context: None,
            };
            sim.push_reply(ScriptedReply::text("fine"));
            assert!(p.send(&req).await.is_ok());
            // A retried 429, then an error that is returned.
            sim.push_fault(Fault::Status {
                status: 429,
                retry_after: None,
            });
            sim.push_fault(Fault::Status {
                status: 500,
                retry_after: None,
            });
            let e = p.send(&req).await.unwrap_err();
            shown.push_str(&format!("{e} {e:?}"));
            sim.push_fault(Fault::Reset);
            let e = p.send(&req).await.unwrap_err();
            shown.push_str(&format!("{e} {e:?}"));
        }
    }
    let logs = String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
    assert!(
        logs.contains("transient provider failure, retrying"),
        "the subscriber saw the calls"
    );
    assert!(logs.contains("reqwest"), "HTTP library logs were captured");
    for secret in [KEY, AWS_SECRET, AWS_TOKEN] {
        assert!(!logs.contains(secret), "{secret} in logs");
        assert!(!shown.contains(secret), "{secret} in errors or Debug");
    }
    for r in sim.requests() {
        assert!(!r.body.contains(KEY) && !r.body.contains(AWS_SECRET));
    }
}
