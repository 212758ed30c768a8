//! Images through both APIs: a 4000×3000 JPEG and a transparent PNG reach the provider at
//! most 1568 px on their longest edge (JPEG and PNG respectively), the originals are archived
//! and recalled byte-identical, and images that cannot be read are refused with a 400.

use std::io::Cursor;

use base64::Engine as _;
use cairn_agent::server::{AppState, router};
use cairn_sim::{ScriptedReply, Sim};
use image::{DynamicImage, ImageFormat, Rgb, RgbImage, Rgba, RgbaImage};
use serde_json::{Value, json};

use crate::support::agent::*;

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

fn photo() -> Vec<u8> {
    let img = RgbImage::from_fn(4000, 3000, |x, y| {
        Rgb([(x / 16) as u8, (y / 12) as u8, ((x + y) / 28) as u8])
    });
    let mut out = Vec::new();
    let enc = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90);
    DynamicImage::ImageRgb8(img)
        .write_with_encoder(enc)
        .expect("jpeg");
    out
}

fn transparent_png() -> Vec<u8> {
    let img = RgbaImage::from_fn(2400, 1800, |x, y| {
        let a = if (x / 200 + y / 200) % 2 == 0 { 0 } else { 255 };
        Rgba([(x / 10) as u8, (y / 8) as u8, 120, a])
    });
    let mut out = Cursor::new(Vec::new());
    DynamicImage::ImageRgba8(img)
        .write_to(&mut out, ImageFormat::Png)
        .expect("png");
    out.into_inner()
}

fn data_url(media: &str, bytes: &[u8]) -> String {
    format!("data:{media};base64,{}", b64().encode(bytes))
}

/// Every data-URL image of a Chat Completions request body the provider got.
fn sent_images(body: &str) -> Vec<(ImageFormat, u32, u32)> {
    let v: Value = serde_json::from_str(body).expect("request json");
    let mut out = Vec::new();
    for m in v["messages"].as_array().into_iter().flatten() {
        for p in m["content"].as_array().into_iter().flatten() {
            if let Some(url) = p["image_url"]["url"].as_str() {
                let (head, data) = url.split_once(',').expect("data url");
                let bytes = b64().decode(data).expect("base64");
                let format = image::guess_format(&bytes).expect("format");
                let img = image::load_from_memory(&bytes).expect("decodes");
                assert!(head.contains(if format == ImageFormat::Png {
                    "png"
                } else {
                    "jpeg"
                }));
                out.push((format, img.width(), img.height()));
                if format == ImageFormat::Png {
                    assert!(img.color().has_alpha(), "the PNG kept its transparency");
                }
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_images_are_shrunk_before_sending_and_their_originals_recalled() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let env = storage_env(dir.path(), None);
    let built = build_session(
        &config_yaml("images", &format!("{}/v1", sim.url()), 200_000, ""),
        &env,
        "t",
    )
    .await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let app = router(AppState::new(built.session, TOKEN), 32 << 20);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let api = Api::new(base);
    let (jpeg, png) = (photo(), transparent_png());

    // The Responses API: a photo.
    sim.push_reply(ScriptedReply::text("a gradient"));
    let first = json!({"role": "user", "content": [
        {"type": "input_text", "text": "what is this?"},
        {"type": "input_image", "image_url": data_url("image/jpeg", &jpeg)}
    ]});
    let (s, r) = api
        .post(
            "/v1/responses",
            json!({"model": MODEL, "input": [first.clone()]}),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    let shrunk = &r["cairn"]["images"][0];
    assert_eq!(shrunk["sent"]["mediaType"], "image/jpeg");
    assert!(shrunk["sent"]["bytes"].as_u64().unwrap() < jpeg.len() as u64);
    let sent = sent_images(&sim.requests()[0].body);
    assert_eq!(sent, [(ImageFormat::Jpeg, 1568, 1176)]);
    let key = shrunk["key"].as_str().unwrap();
    let (s, original) = api.get(&format!("/v1/recall/{key}")).await;
    assert_eq!(s, 200);
    assert!(
        original == jpeg,
        "the original JPEG comes back byte for byte"
    );

    // Chat Completions, replaying that exchange: a transparent PNG.
    sim.push_reply(ScriptedReply::text("a checkerboard"));
    let messages = json!([
        {"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": data_url("image/jpeg", &jpeg)}}
        ]},
        {"role": "assistant", "content": "a gradient"},
        {"role": "user", "content": [
            {"type": "text", "text": "and this?"},
            {"type": "image_url", "image_url": {"url": data_url("image/png", &png), "detail": "auto"}}
        ]}
    ]);
    let (s, r) = api
        .post(
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": messages}),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["choices"][0]["message"]["content"], "a checkerboard");
    let shrunk = &r["cairn"]["images"];
    assert_eq!(
        shrunk.as_array().unwrap().len(),
        1,
        "the replayed photo is not new"
    );
    assert_eq!(shrunk[0]["sent"]["mediaType"], "image/png");
    let sent = sent_images(&sim.requests()[1].body);
    assert_eq!(
        sent,
        [
            (ImageFormat::Jpeg, 1568, 1176),
            (ImageFormat::Png, 1568, 1176)
        ]
    );
    let key = shrunk[0]["key"].as_str().unwrap();
    let (s, original) = api.get(&format!("/v1/recall/{key}")).await;
    assert_eq!(s, 200);
    assert!(original == png, "the original PNG comes back byte for byte");

    // And the other way round: the PNG on the Responses API (only the new item, after the
    // latest response), the photo on Chat Completions (the whole conversation resent).
    sim.push_reply(ScriptedReply::text("the checkerboard again"));
    let (s, r3) = api
        .post(
            "/v1/responses",
            json!({"model": MODEL, "previous_response_id": r["id"], "input": [{"role": "user", "content": [
                {"type": "input_text", "text": "once more"},
                {"type": "input_image", "image_url": data_url("image/png", &png)}
            ]}]}),
        )
        .await;
    assert_eq!(s, 200, "{r3}");
    assert_eq!(r3["cairn"]["images"][0]["sent"]["mediaType"], "image/png");
    let sent = sent_images(&sim.requests()[2].body);
    assert_eq!(sent.len(), 3);
    assert_eq!(sent[2], (ImageFormat::Png, 1568, 1176));
    sim.push_reply(ScriptedReply::text("the gradient again"));
    let mut all = messages.as_array().unwrap().clone();
    all.push(json!({"role": "assistant", "content": "a checkerboard"}));
    all.push(json!({"role": "user", "content": [
        {"type": "text", "text": "once more"},
        {"type": "image_url", "image_url": {"url": data_url("image/png", &png)}}
    ]}));
    all.push(json!({"role": "assistant", "content": "the checkerboard again"}));
    all.push(json!({"role": "user", "content": [
        {"type": "text", "text": "and the photo?"},
        {"type": "image_url", "image_url": {"url": data_url("image/jpeg", &jpeg)}}
    ]}));
    let (s, r4) = api
        .post(
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": all}),
        )
        .await;
    assert_eq!(s, 200, "{r4}");
    assert_eq!(r4["cairn"]["images"].as_array().unwrap().len(), 1);
    assert_eq!(r4["cairn"]["images"][0]["sent"]["mediaType"], "image/jpeg");
    let sent = sent_images(&sim.requests()[3].body);
    assert_eq!(sent.len(), 4);
    assert_eq!(sent[3], (ImageFormat::Jpeg, 1568, 1176));

    // What the history weighs is what was sent, not the originals.
    let session = api.session().await;
    assert!(
        session["stats"]["historyBytes"].as_u64().unwrap() < (jpeg.len() + png.len()) as u64,
        "{session}"
    );

    // Images that cannot be used are refused; nothing reaches the provider.
    for bad in [
        json!({"type": "input_image", "image_url": "data:image/png;base64,AAAA"}),
        json!({"type": "input_image", "image_url": "data:image/png;base64,@@@"}),
        json!({"type": "input_image", "image_url": data_url("image/png", &jpeg)}),
        json!({"type": "input_image", "image_url": "https://example.com/a.png"}),
        json!({"type": "input_image", "image_url": "data:image/bmp;base64,AAAA"}),
    ] {
        let (s, e) = api
            .post(
                "/v1/responses",
                json!({"input": [{"role": "user", "content": [bad.clone()]}]}),
            )
            .await;
        assert_eq!(s, 400, "{bad}: {e}");
    }
    assert_eq!(sim.requests().len(), 4);
}
