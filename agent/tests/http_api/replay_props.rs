//! Replay reconciliation (`cairn_agent::replay`), as properties:
//! - any replay of the accepted conversation plus new items appends exactly the new items,
//!   whatever the client re-serialized (function-call arguments), renamed (ids of items the
//!   session did not issue) or left out (assistant text);
//! - any contradiction of the accepted conversation is refused as a divergence naming an item
//!   at or before the first changed one;
//! - the same holds through a served session's API, across compactions and restarts, and a
//!   refused input changes nothing (no model call, no ledger entry).

use crate::support::agent::*;
use cairn_agent::history::ToolCall;
use cairn_agent::replay::{
    Api as Wire, Held, Incoming, Item, ItemRole, Ledger, Refusal, output_items, reconcile,
};
use cairn_agent::server::AppState;
use cairn_sim::{ScriptedReply, Sim};
use proptest::prelude::*;
use serde_json::{Value, json};

/// One exchange: what the client sends, then what the session answers.
#[derive(Clone, Debug)]
enum Step {
    /// A user message; the answer is text.
    Ask(String),
    /// A user message answered with calls of the client's tools, whose outputs the client
    /// sends next.
    Tools(String, Vec<(String, String)>),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        "[a-z ]{0,12}".prop_map(Step::Ask),
        (
            "[a-z ]{0,12}",
            prop::collection::vec(("[a-z]{1,6}", "[a-z0-9]{0,8}"), 1..3)
        )
            .prop_map(|(q, calls)| Step::Tools(q, calls)),
    ]
}

fn msg(role: ItemRole, text: &str) -> Item {
    Item::Message {
        role,
        text: text.into(),
        images: vec![],
    }
}

/// Accepts `new` into the ledger the way a turn does, with the session's answer.
fn accept(ledger: &mut Ledger, new: &[Item], text: &str, calls: &[ToolCall], n: usize) {
    ledger.items.extend(new.iter().map(Held::input));
    let outputs = output_items(text, calls)
        .into_iter()
        .map(|(item, id)| Held::output(&item, id))
        .collect();
    ledger.complete(outputs, format!("resp_{n}"));
}

/// The conversation of `steps` as the client keeps it, and the ledger a session holds for it.
fn converse(steps: &[Step]) -> (Vec<Incoming>, Ledger) {
    let mut conv: Vec<Incoming> = Vec::new();
    let mut ledger = Ledger::default();
    let mut pending: Vec<Item> = Vec::new();
    for (n, s) in steps.iter().enumerate() {
        let question = format!(
            "q{n}: {}",
            match s {
                Step::Ask(q) | Step::Tools(q, _) => q,
            }
        );
        let mut new = std::mem::take(&mut pending);
        new.push(msg(ItemRole::User, &question));
        let from = reconcile(&ledger, Wire::Chat, &with(&conv, &new), None).expect("accepted");
        assert_eq!(from, conv.len());
        conv.extend(new.iter().cloned().map(|item| Incoming { item, id: None }));
        let (text, calls) = match s {
            Step::Ask(_) => (format!("answer {n}"), vec![]),
            Step::Tools(_, c) => (
                String::new(),
                c.iter()
                    .enumerate()
                    .map(|(k, (name, arg))| ToolCall {
                        id: format!("call_{n}_{k}"),
                        name: name.clone(),
                        arguments: json!({ "arg": arg, "n": k }).to_string(),
                    })
                    .collect(),
            ),
        };
        accept(&mut ledger, &new, &text, &calls, n);
        for (item, id) in output_items(&text, &calls) {
            conv.push(Incoming { item, id });
        }
        pending = calls
            .iter()
            .map(|c| Item::FunctionCallOutput {
                call_id: c.id.clone(),
                output: format!("output of {}", c.id),
            })
            .collect();
    }
    for item in pending {
        conv.push(Incoming { item, id: None });
    }
    (conv, ledger)
}

fn with(conv: &[Incoming], new: &[Item]) -> Vec<Incoming> {
    let mut v = conv.to_vec();
    v.extend(new.iter().cloned().map(|item| Incoming { item, id: None }));
    v
}

/// How a framework may resend what it was given without changing its meaning.
fn resend(conv: &[Incoming], reserialize: bool, drop_ids: bool, drop_text: bool) -> Vec<Incoming> {
    conv.iter()
        .filter(|i| {
            !(drop_text
                && matches!(&i.item, Item::Message { role: ItemRole::Assistant, text, .. } if !text.is_empty()))
        })
        .map(|i| {
            let mut i = i.clone();
            if reserialize
                && let Item::FunctionCall { arguments, .. } = &mut i.item
                && let Ok(v) = serde_json::from_str::<Value>(arguments)
            {
                *arguments = serde_json::to_string_pretty(&v).unwrap_or_default();
            }
            if drop_ids {
                i.id = None;
            }
            i
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_replay_plus_new_items_appends_exactly_the_new_items(
        steps in prop::collection::vec(step(), 1..8),
        new in prop::collection::vec("[a-z]{1,8}", 1..3),
        reserialize: bool,
        drop_ids: bool,
        drop_text: bool,
        responses: bool,
    ) {
        let (conv, ledger) = converse(&steps);
        let new: Vec<Item> = new.iter().map(|t| msg(ItemRole::User, &format!("new {t}"))).collect();
        let mut input = resend(&conv, reserialize, drop_ids, drop_text);
        // The outputs of the client's tools that end the conversation are new too.
        let held_part = input.len() - trailing_outputs(&input);
        let mut expected: Vec<Item> = input[held_part..].iter().map(|i| i.item.clone()).collect();
        expected.extend(new.iter().cloned());
        input.extend(new.iter().cloned().map(|item| Incoming { item, id: None }));
        // On the Responses API a replay is recognised by the outputs it carries; an
        // exchange of only tool calls whose ids were dropped still matches by fingerprint.
        let api = if responses { Wire::Responses } else { Wire::Chat };
        let carries_output = input[..held_part].iter().any(|i| {
            matches!(&i.item, Item::FunctionCall { .. } | Item::Message { role: ItemRole::Assistant, .. })
        });
        // Without any item the session answered with, a Responses input is new items only:
        // that is how an incremental client is told from a replaying one.
        prop_assume!(!responses || carries_output);
        let from = reconcile(&ledger, api, &input, None).expect("a replay is accepted");
        prop_assert_eq!(from, held_part);
        let appended: Vec<Item> = input[from..].iter().map(|i| i.item.clone()).collect();
        prop_assert_eq!(appended, expected);
    }

    #[test]
    fn a_contradiction_is_a_divergence_at_or_before_the_changed_item(
        steps in prop::collection::vec(step(), 1..8),
        at in any::<prop::sample::Index>(),
        truncate: bool,
        edit_answer: bool,
    ) {
        let (conv, ledger) = converse(&steps);
        // Only items the session holds can be contradicted. An answer's text may be left out
        // (not contradicted), but not replaced by another text.
        prop_assert_eq!(ledger.items.len(), conv.len() - trailing_outputs(&conv));
        let is_answer = |i: usize| matches!(conv[i].item, Item::Message { role: ItemRole::Assistant, .. });
        let held: Vec<usize> = (0..ledger.items.len())
            .filter(|&i| is_answer(i) == edit_answer)
            .collect();
        prop_assume!(!held.is_empty());
        let k = held[at.index(held.len())];
        let mut input = conv.clone();
        if edit_answer {
            input[k].item = msg(ItemRole::Assistant, "an answer never given");
        } else if truncate {
            input.truncate(k);
            prop_assume!(!input.is_empty());
        } else {
            input[k].item = msg(ItemRole::User, "a different story");
            input[k].id = None;
        }
        input.push(Incoming { item: msg(ItemRole::User, "and then?"), id: None });
        match reconcile(&ledger, Wire::Chat, &input, None) {
            Err(Refusal::Diverged { index, .. }) => prop_assert!(index <= k, "{index} > {k}"),
            other => prop_assert!(false, "not a divergence: {other:?}"),
        }
    }
}

/// Function-call outputs at the end of the conversation the session has not accepted yet.
fn trailing_outputs(conv: &[Incoming]) -> usize {
    conv.iter()
        .rev()
        .take_while(|i| matches!(i.item, Item::FunctionCallOutput { .. }))
        .count()
}

#[test]
fn an_unknown_or_stale_previous_response_is_refused() {
    let (_, ledger) = converse(&[Step::Ask("a".into()), Step::Ask("b".into())]);
    let input = [Incoming {
        item: msg(ItemRole::User, "c"),
        id: None,
    }];
    assert_eq!(
        reconcile(&ledger, Wire::Responses, &input, Some("resp_1")),
        Ok(0)
    );
    assert!(matches!(
        reconcile(&ledger, Wire::Responses, &input, Some("resp_0")),
        Err(Refusal::Stale { .. })
    ));
    assert!(matches!(
        reconcile(&ledger, Wire::Responses, &input, Some("resp_x")),
        Err(Refusal::PreviousNotFound(_))
    ));
}

/// What a served session is asked to do.
#[derive(Clone, Debug)]
enum Op {
    /// A replayed conversation plus one question, on Chat Completions or Responses.
    Replay {
        responses: bool,
    },
    /// Only the question, naming the latest response.
    Incremental,
    /// A replay whose item `at` was changed.
    Contradict(prop::sample::Index),
    Compact,
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => any::<bool>().prop_map(|responses| Op::Replay { responses }),
        1 => Just(Op::Incremental),
        1 => any::<prop::sample::Index>().prop_map(Op::Contradict),
        1 => Just(Op::Compact),
        1 => Just(Op::Restart),
    ]
}

struct Served {
    state: AppState,
    api: Api,
    task: tokio::task::JoinHandle<()>,
}

async fn open(yaml: &str, env: &[(String, String)], holder: &str) -> Served {
    let built = build_session(yaml, env, holder).await;
    let state = AppState::new(built.session, TOKEN);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let app = cairn_agent::server::router(state.clone(), 8 << 20);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Served {
        state,
        api: Api::new(base),
        task,
    }
}

/// The client's copy of the conversation: (role, text) pairs.
fn chat_body(conv: &[(String, String)]) -> Value {
    json!({"model": MODEL, "messages": conv.iter().map(|(r, t)| json!({"role": r, "content": t})).collect::<Vec<_>>()})
}

fn responses_body(conv: &[(String, String)]) -> Value {
    let input: Vec<Value> = conv
        .iter()
        .map(|(r, t)| {
            if r == "assistant" {
                json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": t, "annotations": []}]})
            } else {
                json!({"role": r, "content": t})
            }
        })
        .collect();
    json!({"model": MODEL, "input": input})
}

async fn run_schedule(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let sim = Sim::start().await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let env = storage_env(dir.path(), None);
    let yaml = config_yaml(
        "replay",
        &format!("{}/v1", sim.url()),
        200_000,
        "compaction: {summarizer: {enabled: false}, minKeepRecent: 2}\n",
    );
    let mut served = open(&yaml, &env, "h0").await;
    let mut conv: Vec<(String, String)> = Vec::new();
    let mut latest: Option<String> = None;
    let mut restarts = 0;
    for (n, op) in ops.into_iter().enumerate() {
        let ledger_before = served.state.session.lock().await.ledger().clone();
        let calls_before = sim.requests().len();
        // Long questions, so that a compaction has something to cut.
        let question = format!("question {n} {}", "detail ".repeat(400));
        let answer = format!("answer {n}");
        match op {
            Op::Replay { .. } | Op::Incremental => {
                sim.push_reply(ScriptedReply::text(answer.clone()));
                let mut next = conv.clone();
                next.push(("user".into(), question.clone()));
                let (path, body) = match (&op, &latest) {
                    (Op::Incremental, Some(id)) => (
                        "/v1/responses",
                        json!({"model": MODEL, "input": question, "previous_response_id": id}),
                    ),
                    (Op::Replay { responses: true }, _) | (Op::Incremental, None) => {
                        ("/v1/responses", responses_body(&next))
                    }
                    _ => ("/v1/chat/completions", chat_body(&next)),
                };
                let (s, v) = served.api.post(path, body).await;
                prop_assert_eq!(s, 200, "{}", v);
                let text = v["output"][0]["content"][0]["text"]
                    .as_str()
                    .or(v["choices"][0]["message"]["content"].as_str())
                    .unwrap_or_default()
                    .to_owned();
                prop_assert_eq!(&text, &answer);
                latest = v["id"].as_str().map(str::to_owned);
                conv = next;
                conv.push(("assistant".into(), text));
                // Exactly the question and the answer were added.
                let ledger = served.state.session.lock().await.ledger().clone();
                prop_assert_eq!(ledger.items.len(), ledger_before.items.len() + 2);
                prop_assert_eq!(
                    &ledger.items[..ledger_before.items.len()],
                    &ledger_before.items[..]
                );
                let reqs = sim.requests();
                prop_assert_eq!(reqs.len(), calls_before + 1);
                let body = &reqs[reqs.len() - 1].body;
                let this = format!("question {} ", n);
                prop_assert_eq!(body.matches(&this).count(), 1);
                for k in 0..n {
                    let earlier = format!("question {} ", k);
                    prop_assert!(body.matches(&earlier).count() <= 1, "{} twice", earlier);
                }
            }
            Op::Contradict(at) => {
                if conv.is_empty() {
                    continue;
                }
                let mut changed = conv.clone();
                let i = at.index(changed.len());
                changed[i].1.push_str(" (edited)");
                changed.push(("user".into(), question));
                let (s, v) = served
                    .api
                    .post("/v1/chat/completions", chat_body(&changed))
                    .await;
                prop_assert_eq!(s, 409, "{}", v);
                prop_assert_eq!(&v["error"]["code"], "history_diverged");
                prop_assert_eq!(sim.requests().len(), calls_before);
                let ledger = served.state.session.lock().await.ledger().clone();
                prop_assert_eq!(ledger, ledger_before);
            }
            Op::Compact => {
                let (s, v) = served.api.post("/v1/session/compact", json!({})).await;
                prop_assert!(s < 500, "{} {}", s, v);
            }
            Op::Restart => {
                served.task.abort();
                drop(served);
                restarts += 1;
                served = open(&yaml, &env, &format!("h{restarts}")).await;
                let ledger = served.state.session.lock().await.ledger().clone();
                prop_assert_eq!(ledger, ledger_before);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    #[test]
    fn a_served_session_appends_only_new_items_across_compactions_and_restarts(
        ops in prop::collection::vec(op(), 4..14),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(run_schedule(ops))?;
    }
}
