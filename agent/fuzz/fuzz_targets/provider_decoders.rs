//! Fuzzes every provider response decoder (whole bodies and event streams): any input must
//! give a reply or a typed error, never a panic.
#![no_main]

use cairn_agent::provider::decode;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode::openai(data);
    let _ = decode::openai_stream(data);
    let _ = decode::responses(data);
    let _ = decode::responses_stream(data);
    let _ = decode::anthropic(data);
    let _ = decode::anthropic_stream(data);
    let _ = decode::gemini(data);
    let _ = decode::gemini_stream(data);
    let _ = decode::bedrock(data);
    let mut sse = cairn_agent::provider::sse::SseDecoder::new(4096);
    for chunk in data.chunks(7) {
        if sse.feed(chunk).is_err() {
            break;
        }
    }
    let _ = sse.finish();
});
