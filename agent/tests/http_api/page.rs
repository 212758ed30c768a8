//! The session page (`GET /ui`) in a real browser: Debian's Chromium, headless, over
//! WebDriver. A session against cairn-sim works on a small project and compacts; the page
//! then shows nothing without the session's token, and with it draws the window by part
//! with the headroom tiers, the compaction timeline with scores whose archived keys recall
//! the original bytes, and a `why` search that finds where a path went.

use std::time::Duration;

use cairn_sim::Sim;
use cairn_tests::harness::browser::Browser;
use serde_json::{Value, json};

use crate::support::agent::*;

/// A turn as a coding session brings it: a request naming a file, a command and the
/// error its output ends with, and the output itself.
fn turn(i: usize) -> String {
    let mut out = format!(
        "Turn {i}: please fix src/net/pool_{i}.rs. Running `cargo test -p net --test pool_{i}` ends with:\n"
    );
    for line in 0..60 {
        out.push_str(&format!(
            "test pool_{i}::case_{line} ... ok (checked connection {line} of the pool)\n"
        ));
    }
    out.push_str(&format!(
        "error[E0599]: no method named `checkout_{i}` found for struct `Pool` in the current scope\n"
    ));
    out
}

async fn js(browser: &Browser, script: &str) -> Value {
    browser.eval(script).await.expect("the page's script")
}

async fn until(browser: &Browser, what: &str, script: &str) -> Value {
    browser
        .until(what, script, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_page_draws_the_window_the_timeline_and_answers_why_in_chromium() {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("page.yaml");
    std::fs::write(
        &config,
        config_yaml("page", &format!("{}/v1", sim.url()), 6_000, ""),
    )
    .expect("config");
    let env = storage_env(&dir.path().join("data"), None);
    let agent = AgentProcess::start(&config, &env, &dir.path().join("agent.log"));
    let api = Api::new(&agent.url);
    for i in 0..8 {
        let (status, body) = api.turn(&turn(i)).await;
        assert_eq!(status, 200, "turn {i}: {body}");
    }
    let (status, body) = api
        .post(
            "/v1/session/compact",
            json!({"instruction": "keep the paths"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let session = api.session().await;
    let timeline = session["timeline"].as_array().cloned().unwrap_or_default();
    assert!(
        timeline.len() >= 2,
        "the session compacted on its own and when asked: {session}"
    );

    let browser = Browser::start(dir.path()).await.expect("chromium");
    let page = format!("{}/ui", agent.url);

    // Without the token: the sign-in box, and nothing of the session.
    browser.client.goto(&page).await.expect("the page");
    until(
        &browser,
        "the sign-in box",
        "return !document.getElementById('signin').classList.contains('hidden')",
    )
    .await;
    let seen = js(
        &browser,
        "return [document.getElementById('page').classList.contains('hidden'),
                 document.querySelectorAll('#grid .cell, #timeline tbody tr').length,
                 document.body.innerText.includes('pool_')]",
    )
    .await;
    assert_eq!(seen, json!([true, 0, false]), "nothing without the token");
    // A wrong token is no better.
    js(
        &browser,
        "document.getElementById('token').value = 'wrong-token';
         document.querySelector('#token-form button').click(); return true",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seen = js(
        &browser,
        "return [document.getElementById('signin').classList.contains('hidden'),
                 document.querySelectorAll('#grid .cell').length]",
    )
    .await;
    assert_eq!(seen, json!([false, 0]), "a wrong token shows nothing");

    // With the session's token.
    js(
        &browser,
        &format!(
            "document.getElementById('token').value = '{TOKEN}';
             document.querySelector('#token-form button').click(); return true"
        ),
    )
    .await;
    until(
        &browser,
        "the window's hundred cells",
        "return document.querySelectorAll('#grid .cell').length === 100",
    )
    .await;
    let parts = js(
        &browser,
        "return [...document.querySelectorAll('#grid .cell')].map(c => c.dataset.part)",
    )
    .await;
    let parts: Vec<&str> = parts
        .as_array()
        .expect("cells")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for part in ["system", "messages"] {
        assert!(parts.contains(&part), "the window shows {part}: {parts:?}");
    }
    assert!(parts.contains(&"free"), "room is left: {parts:?}");
    let tiers = js(
        &browser,
        "return [...document.querySelectorAll('#grid .cell[data-tier]')].map(c => c.dataset.tier)",
    )
    .await;
    let tiers = tiers.as_array().cloned().unwrap_or_default();
    for tier in ["warning", "auto-compact", "blocking"] {
        assert!(
            tiers.iter().any(|t| t == tier),
            "the {tier} tier is marked: {tiers:?}"
        );
    }
    let state = js(
        &browser,
        "return document.getElementById('state').textContent",
    )
    .await;
    assert!(
        ["normal", "warning", "auto-compact", "blocking"].contains(&state.as_str().unwrap_or("")),
        "{state}"
    );

    // The timeline: one row per compaction, newest first, with its level and score.
    let rows = js(
        &browser,
        "return [...document.querySelectorAll('#timeline tbody tr')].map(r =>
            [r.dataset.level, r.querySelector('[data-score]')?.dataset.score ?? null,
             r.querySelectorAll('a.marker').length])",
    )
    .await;
    let rows = rows.as_array().cloned().unwrap_or_default();
    assert_eq!(rows.len(), timeline.len(), "{rows:?} for {timeline:?}");
    assert!(
        rows.iter().any(|r| r[1].is_string()),
        "a compaction's score is shown: {rows:?}"
    );
    assert!(
        rows.iter().any(|r| r[2].as_u64().unwrap_or(0) > 0),
        "archived keys are shown: {rows:?}"
    );

    // A key of the timeline recalls the original bytes.
    let key = js(
        &browser,
        "const a = document.querySelector('#timeline a.marker'); a.click(); return a.dataset.key",
    )
    .await;
    let key = key.as_str().expect("a key").to_owned();
    until(
        &browser,
        "the recalled text",
        "return !document.getElementById('recall').classList.contains('hidden')
                && document.getElementById('recall-text').textContent.length > 0",
    )
    .await;
    let shown = js(
        &browser,
        "return document.getElementById('recall-text').textContent",
    )
    .await;
    let (status, original) = api.get(&format!("/v1/recall/{key}")).await;
    assert_eq!(status, 200);
    assert_eq!(
        shown.as_str().unwrap_or(""),
        String::from_utf8_lossy(&original),
        "the page shows the archived original of {key}"
    );

    // Why: the first turn's file went into the archive (and the ledger keeps it in sight).
    js(
        &browser,
        "document.getElementById('why').value = 'src/net/pool_0.rs';
         document.querySelector('#why-form button').click(); return true",
    )
    .await;
    let places = until(
        &browser,
        "the places of src/net/pool_0.rs",
        "const rows = [...document.querySelectorAll('#places tbody tr')];
         return rows.length ? rows.map(r => r.dataset.where) : null",
    )
    .await;
    assert!(
        places
            .as_array()
            .is_some_and(|p| p.iter().any(|w| w == "archived")),
        "the path is found in the archive: {places}"
    );

    if let Ok(path) = std::env::var("CAIRN_PAGE_SCREENSHOT") {
        js(&browser, "window.scrollTo(0, 0); return true").await;
        let png = browser.screenshot().await.expect("screenshot");
        std::fs::write(&path, png).expect("screenshot file");
        eprintln!("screenshot: {path}");
    }
}
