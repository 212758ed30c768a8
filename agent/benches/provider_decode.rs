//! Decoding cost of streamed replies: the SSE decoder plus each provider's event assembly,
//! for a long reply (about 8,000 small deltas, as a verbose model streams them).

use cairn_agent::provider::decode;
use cairn_sim::Stop;
use cairn_sim::wire::{Turn, Wire, render_reply};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn long_turn() -> Turn {
    Turn {
        seq: 1,
        model: "m".into(),
        text: "The quick brown fox jumps over the lazy dog. ".repeat(1_400),
        reasoning: None,
        calls: vec![(
            "call_1".into(),
            "write_file".into(),
            serde_json::json!({"path": "a.rs", "content": "fn main() {}\n".repeat(300)}),
        )],
        stop: Stop::ToolUse,
        input_tokens: 1000,
        output_tokens: 20_000,
        cached_tokens: 0,
        cache_write_tokens: 0,
        context_management: None,
        compaction: None,
    }
}

fn streams(c: &mut Criterion) {
    let turn = long_turn();
    let mut group = c.benchmark_group("stream_decode");
    for (name, wire, decoder) in [
        (
            "openai_chat",
            Wire::OpenaiChat,
            decode::openai_stream as fn(&[u8]) -> _,
        ),
        (
            "openai_responses",
            Wire::OpenaiResponses,
            decode::responses_stream,
        ),
        ("anthropic", Wire::Anthropic, decode::anthropic_stream),
        ("gemini", Wire::Gemini, decode::gemini_stream),
        ("bedrock", Wire::Bedrock, decode::bedrock_stream),
    ] {
        let bytes = render_reply(wire, &turn, true, true).frames.concat();
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.bench_function(name, |b| {
            b.iter(|| decoder(std::hint::black_box(&bytes)).map(|r| r.usage))
        });
    }
    group.finish();
}

criterion_group!(benches, streams);
criterion_main!(benches);
