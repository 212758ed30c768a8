//! `spec.provider` edits reach a running session: the next model call goes to the new base
//! URL, model and API family through a rebuilt client, without a restart; settings that
//! cannot be built fail that turn with a clear message and leave the history untouched.

use std::sync::Arc;

use cairn_agent::config::Live;
use cairn_agent::history::Message;
use cairn_agent::session::TurnError;
use cairn_crds::{ProviderKind, ProviderSpec};
use cairn_sim::{ScriptedReply, Sim, Wire};

use crate::support::agent::*;

/// Edits of `spec.provider`, as the AgentSession watch delivers them.
struct Edits(tokio::sync::watch::Sender<Arc<Live>>);

fn edit(edits: &Edits, change: impl FnOnce(&mut ProviderSpec)) {
    let mut live = (**edits.0.borrow()).clone();
    change(&mut live.spec.provider);
    edits.0.send_replace(Arc::new(live));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_edit_reaches_the_next_call_without_a_restart() {
    let (a, b) = (
        Sim::start().await.expect("sim a"),
        Sim::start().await.expect("sim b"),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let env = storage_env(dir.path(), None);
    let yaml = config_yaml("follow", &format!("{}/v1", a.url()), 200_000, "");
    let built = build_following_session(&yaml, &env, "a").await;
    let mut session = built.session;
    let built = Edits(built.live_tx);

    a.push_reply(ScriptedReply::text("from a"));
    let out = session
        .turn(vec![Message::user("one")])
        .await
        .expect("turn 1");
    assert_eq!(out.text, "from a");

    // New base URL and model: the next call goes to b, with the new model.
    edit(&built, |p| {
        p.base_url = Some(format!("{}/v1", b.url()));
        p.model = "m-2".into();
    });
    b.push_reply(ScriptedReply::text("from b"));
    let out = session
        .turn(vec![Message::user("two")])
        .await
        .expect("turn 2");
    assert_eq!(out.text, "from b");
    assert_eq!(a.requests().len(), 1);
    let sent = b.requests();
    assert_eq!((sent.len(), sent[0].model.as_str()), (1, "m-2"));
    assert_eq!(sent[0].wire, Wire::OpenaiChat);
    // The whole conversation went along: nothing was lost by the switch.
    assert!(sent[0].contains("one") && sent[0].contains("from a") && sent[0].contains("two"));

    // A different API family on the same endpoint.
    edit(&built, |p| {
        p.kind = ProviderKind::Anthropic;
        p.model = "claude-test".into();
    });
    b.push_reply(ScriptedReply::text("from b as anthropic"));
    let out = session
        .turn(vec![Message::user("three")])
        .await
        .expect("turn 3");
    assert_eq!(out.text, "from b as anthropic");
    let sent = b.requests();
    assert_eq!(sent.last().map(|r| r.wire), Some(Wire::Anthropic));

    // Settings no client can be built from: that turn fails and says why; the history
    // keeps only what was acknowledged.
    edit(&built, |p| {
        p.kind = ProviderKind::Bedrock;
        p.region = None;
        p.base_url = None;
    });
    let err = session
        .turn(vec![Message::user("four")])
        .await
        .expect_err("bedrock without a region");
    let TurnError::Provider { message, .. } = &err else {
        panic!("{err:?}");
    };
    assert!(
        message.contains("the changed provider settings cannot be used"),
        "{message}"
    );
    let before = b.requests().len();
    edit(&built, |p| {
        p.kind = ProviderKind::OpenaiCompatible;
        p.base_url = Some(format!("{}/v1", b.url()));
    });
    b.push_reply(ScriptedReply::text("back"));
    let out = session
        .turn(vec![Message::user("five")])
        .await
        .expect("turn 5");
    assert_eq!(out.text, "back");
    let last = b.requests().pop().expect("request");
    assert_eq!(b.requests().len(), before + 1);
    assert!(last.contains("five") && !last.contains("four"));
}
