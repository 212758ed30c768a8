//! Building and serializing a request body in each provider's wire format, for a 4 MB
//! history (the part of a turn's overhead that grows with the history in the client).
//!
//! `cargo bench -p cairn-agent --bench provider_encode`

use cairn_agent::provider::{
    Anthropic, Bedrock, ChatRequest, ClientOptions, Gemini, OpenAiChat, OpenAiResponses, WireCache,
};
use cairn_agent::session::tools;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

#[path = "support/history.rs"]
mod fixture;

/// One provider's body builder, straight to bytes as its client sends them.
type Encoder<'a> = dyn Fn(&ChatRequest) -> serde_json::Result<Vec<u8>> + 'a;

fn bodies(c: &mut Criterion) {
    let request = ChatRequest {
        model: "m-1".into(),
        messages: fixture::history(4 << 20),
        tools: tools::catalog(),
        max_output_tokens: 8_192,
        stream: true,
        controls: Default::default(),
        context: None,
    };
    let chat = OpenAiChat::new(
        "openai",
        "http://127.0.0.1:9/v1",
        None,
        false,
        ClientOptions::default(),
    )
    .expect("client");
    let wire = WireCache::new();
    let encoders: [(&str, &Encoder); 6] = [
        ("openai_chat", &|r| serde_json::to_vec(&chat.body(r))),
        ("openai_responses", &|r| {
            serde_json::to_vec(&OpenAiResponses::body(r))
        }),
        ("anthropic", &|r| serde_json::to_vec(&Anthropic::body(r))),
        // As the client sends it: the escaped texts of the previous (here: the same)
        // request reused.
        ("anthropic_reused_texts", &|r| {
            wire.to_vec(&Anthropic::body(r))
        }),
        ("gemini", &|r| serde_json::to_vec(&Gemini::body(r))),
        ("bedrock", &|r| serde_json::to_vec(&Bedrock::body(r))),
    ];
    let mut group = c.benchmark_group("body_4MB");
    group.sample_size(30);
    for (name, encode) in encoders {
        let len = encode(&request).expect("encodes").len();
        group.throughput(Throughput::Bytes(len as u64));
        group.bench_function(name, |b| {
            b.iter(|| encode(std::hint::black_box(&request)).map(|body| body.len()))
        });
    }
    group.finish();
}

criterion_group!(benches, bodies);
criterion_main!(benches);
