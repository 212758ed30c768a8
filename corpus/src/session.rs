//! Coding sessions over a [`Corpus`]: a pure function of the corpus, a seed and a size.
//!
//! A session is what an agent's history holds after a stretch of work on the shop project:
//! a system prompt, then turns of a user request (in the user's words), assistant messages
//! that call tools the way coding agents do (`read_file` with a relative `path`, `edit_file`
//! with an absolute `file_path`, `bash` with a `command`), the tools' results taken from the
//! corpus (a fixture's content, a command's recorded output, an edit's recorded diff) and the
//! assistant's replies. Requests, files, commands and edits are dealt from shuffled decks, so
//! a small session already touches many distinct ones and a large one comes back to them.

use cairn_engine::history::{self, Message, ToolCall};
use serde_json::json;

use crate::{Corpus, Topic};

/// Where the agent's workspace is (edits name files by absolute path, as agents send them).
pub const WORKSPACE: &str = "/home/dana/shop";

/// What the user asks, by topic: short, varied, in the user's words.
pub const REQUESTS: &[(Topic, &str)] = &[
    (
        Topic::Rust,
        "cargo build is broken on main, can you get it compiling again?",
    ),
    (
        Topic::Rust,
        "the ledger tests fail since yesterday, please look",
    ),
    (Topic::Rust, "why does parse_entry turn 12.5 into 12.05??"),
    (Topic::Rust, "fix the report binary, it doesn't build"),
    (Topic::Rust, "clippy is red in CI for the ledger crate"),
    (
        Topic::Rust,
        "the doc test in lib.rs is wrong, an empty ledger has no money",
    ),
    (Topic::Rust, "import should print how many entries it read"),
    (Topic::Rust, "can you make cargo doc pass with -D warnings"),
    (
        Topic::Rust,
        "what's wrong with the migrate bin? borrow error I think",
    ),
    (
        Topic::Rust,
        "the integration test references a journal module that doesn't exist, drop it or write it",
    ),
    (Topic::Python, "pytest fails for inventory, start there"),
    (
        Topic::Python,
        "discounts should round half up, 449.5 cents is 450",
    ),
    (Topic::Python, "restock list should come out sorted"),
    (
        Topic::Python,
        "the cli crashes on the items file, KeyError somewhere",
    ),
    (
        Topic::Python,
        "loading items.json blows up on the tote bag, can you check the data",
    ),
    (
        Topic::Python,
        "run the python tests again and tell me what's left",
    ),
    (
        Topic::Python,
        "is the storage round trip test flaky or really broken?",
    ),
    (
        Topic::Python,
        "show me how pricing.py computes the discount",
    ),
    (Topic::Go, "go test fails in shipping with a panic"),
    (
        Topic::Go,
        "a 500 g parcel to the EU should cost 9.90 not 14.90",
    ),
    (Topic::Go, "Label.Lines panics for cities without a comma"),
    (Topic::Go, "go vet complains about label.go, fix it"),
    (
        Topic::Go,
        "heavy parcels to the world zone have no rate, is that intended?",
    ),
    (Topic::Go, "which zone does FR end up in? check zones.go"),
    (Topic::Go, "rerun the shipping tests after your change"),
    (Topic::Node, "npm test is failing on the cart"),
    (
        Topic::Node,
        "tax should round to the nearest cent, not down",
    ),
    (
        Topic::Node,
        "npm run build crashes, build.json is missing i think",
    ),
    (Topic::Node, "we need a lint script in package.json"),
    (Topic::Node, "npm ci fails in the pipeline, why?"),
    (Topic::Node, "US carts should have no tax at all"),
    (
        Topic::Node,
        "print a receipt with node index.js so I can see the format",
    ),
    (
        Topic::Kube,
        "the web deployment never becomes ready, can you find out why",
    ),
    (
        Topic::Kube,
        "kubectl apply -f deploy/ gives me a bunch of errors",
    ),
    (
        Topic::Kube,
        "the cache configmap is rejected by the API server",
    ),
    (
        Topic::Kube,
        "api.yaml fails with some strict decoding thing",
    ),
    (Topic::Kube, "worker.yaml doesn't apply at all"),
    (
        Topic::Kube,
        "the reader service account can't see secrets, is that right?",
    ),
    (
        Topic::Kube,
        "what does the cluster have in the shop namespace right now",
    ),
    (
        Topic::Kube,
        "check the events in shop, pods seem stuck pending",
    ),
    (
        Topic::Kube,
        "I need the Deployment schema from the openapi spec",
    ),
    (Topic::Kube, "which API resources does this cluster serve?"),
    (Topic::Git, "what changed in the last few commits?"),
    (
        Topic::Git,
        "the rounding patch doesn't apply anymore, can you see why",
    ),
    (
        Topic::Git,
        "cherry-pick the rounding fix from feature/rounding onto main",
    ),
    (Topic::Git, "find all the TODOs in the repo"),
    (Topic::Git, "who wrote money.rs and when?"),
    (
        Topic::Git,
        "show me the diff of everything you changed so far",
    ),
    (Topic::Git, "switch to the feature branch for a minute"),
    (
        Topic::Git,
        "where are balance, total_value, RateFor and taxFor defined?",
    ),
    (Topic::Git, "ok, status? what's still uncommitted"),
    (
        Topic::Git,
        "let's look at the repo history before touching anything",
    ),
];

/// What the assistant says before its tool calls.
const PLANS: &[&str] = &[
    "Let me look at that first.",
    "I'll start by reading the relevant code and running the failing command.",
    "Checking the current state before changing anything.",
    "Let me reproduce it.",
    "I'll read the file and then run it again.",
    "Looking at the code path involved.",
    "",
];

/// What the assistant says when a turn ends.
const REPLIES: &[&str] = &[
    "I've looked at the output above. The failure comes from the code I just read; I made the change and the next run should tell us whether that was all of it.",
    "Done for now. There is still something failing further down in the output, which I'd handle next if you want.",
    "That's the cause. I changed the smallest thing that fixes it and left the rest as it was.",
    "Here's what I found: the command fails for the reason shown in its output, not because of the environment. I'll keep going on it unless you want something else first.",
    "The run shows the problem clearly. I fixed it in the file and would rerun the whole suite next.",
    "I checked it. Nothing else in that area looks wrong to me.",
];

/// Deals the indices `0..len` in shuffled rounds.
struct Deck {
    order: Vec<usize>,
    next: usize,
}

impl Deck {
    fn new(len: usize) -> Self {
        Self {
            order: (0..len).collect(),
            next: len,
        }
    }

    fn deal(&mut self, rng: &mut fastrand::Rng) -> Option<usize> {
        if self.order.is_empty() {
            return None;
        }
        if self.next == self.order.len() {
            rng.shuffle(&mut self.order);
            self.next = 0;
        }
        self.next += 1;
        Some(self.order[self.next - 1])
    }
}

/// What one topic offers, as indices into the corpus.
struct Decks {
    files: Vec<usize>,
    file_deck: Deck,
    runs: Vec<usize>,
    run_deck: Deck,
    edits: Vec<usize>,
    edit_deck: Deck,
}

impl Decks {
    fn of(corpus: &Corpus, topic: Topic) -> Self {
        let files: Vec<usize> = (0..corpus.files.len())
            .filter(|i| Topic::of_path(&corpus.files[*i].path) == topic)
            .collect();
        let runs: Vec<usize> = (0..corpus.runs.len())
            .filter(|i| corpus.runs[*i].topic == topic)
            .collect();
        let edits: Vec<usize> = (0..corpus.edits.len())
            .filter(|i| Topic::of_path(&corpus.edits[*i].path) == topic)
            .collect();
        Self {
            file_deck: Deck::new(files.len()),
            run_deck: Deck::new(runs.len()),
            edit_deck: Deck::new(edits.len()),
            files,
            runs,
            edits,
        }
    }
}

/// A call and the result it gets.
struct Exchange {
    call: ToolCall,
    result: String,
}

/// A coding session over `corpus` of at least `bytes` bytes (as [`history::weight`] counts
/// them; the last turn may go past), the same for the same corpus, seed and size.
pub fn session(corpus: &Corpus, seed: u64, bytes: usize) -> Vec<Message> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut decks: Vec<(Topic, Decks)> = Topic::ALL
        .iter()
        .map(|t| (*t, Decks::of(corpus, *t)))
        .collect();
    let mut requests = Deck::new(REQUESTS.len());
    let mut h = vec![Message::system(SYSTEM_PROMPT)];
    let mut weight = history::weight(&h);
    let mut calls = 0usize;
    while weight < bytes {
        let Some(r) = requests.deal(&mut rng) else {
            break;
        };
        let (topic, request) = REQUESTS[r];
        let mut turn = vec![Message::user(request)];
        let Some((_, deck)) = decks.iter_mut().find(|(t, _)| *t == topic) else {
            break;
        };
        for _ in 0..rng.usize(1..=3) {
            let mut exchanges = Vec::new();
            for _ in 0..rng.usize(1..=2) {
                calls += 1;
                let id = format!("call_{calls:04}");
                if let Some(x) = exchange(corpus, deck, &mut rng, id) {
                    exchanges.push(x);
                }
            }
            if exchanges.is_empty() {
                continue;
            }
            let plan = PLANS[rng.usize(..PLANS.len())];
            let (tool_calls, results): (Vec<ToolCall>, Vec<Message>) = exchanges
                .into_iter()
                .map(|x| {
                    let mut result = Message::tool(x.call.id.clone(), x.result);
                    result.name = Some(x.call.name.clone());
                    (x.call, result)
                })
                .unzip();
            turn.push(Message::assistant_calls(plan, tool_calls));
            turn.extend(results);
        }
        turn.push(Message::assistant(REPLIES[rng.usize(..REPLIES.len())]));
        weight += history::weight(&turn);
        h.extend(turn);
    }
    h
}

/// One tool call of `deck`'s topic: mostly runs and reads, sometimes an edit.
fn exchange(
    corpus: &Corpus,
    deck: &mut Decks,
    rng: &mut fastrand::Rng,
    id: String,
) -> Option<Exchange> {
    let roll = rng.usize(..10);
    if roll < 2
        && let Some(e) = deck.edit_deck.deal(rng)
    {
        let edit = &corpus.edits[deck.edits[e]];
        let arguments = json!({
            "file_path": format!("{WORKSPACE}/{}", edit.path),
            "old_string": edit.old,
            "new_string": edit.new,
        });
        return Some(Exchange {
            call: tool_call(id, "edit_file", &arguments),
            result: edit.diff.clone(),
        });
    }
    if roll < 6
        && let Some(r) = deck.run_deck.deal(rng)
    {
        let run = &corpus.runs[deck.runs[r]];
        return Some(Exchange {
            call: tool_call(id, "bash", &json!({ "command": run.command })),
            result: run.output.clone(),
        });
    }
    let f = deck.file_deck.deal(rng)?;
    let file = &corpus.files[deck.files[f]];
    Some(Exchange {
        call: tool_call(id, "read_file", &json!({ "path": file.path })),
        result: file.content.clone(),
    })
}

fn tool_call(id: String, name: &str, arguments: &serde_json::Value) -> ToolCall {
    ToolCall {
        id,
        name: name.into(),
        arguments: arguments.to_string(),
    }
}

const SYSTEM_PROMPT: &str = "You are a coding agent working in the repository at /home/dana/shop: \
a Rust ledger (rust/), a Python inventory service (python/), a Go shipping module (go/), a \
Node cart (node/) and Kubernetes manifests (deploy/) for a cluster you reach with kubectl.\n\n\
Tools: read_file {path} returns a file's content; edit_file {file_path, old_string, \
new_string} replaces text and returns the diff; bash {command} runs a shell command from the \
repository root and returns its output.\n\n\
Read before you edit. Run the tests after a change. Keep changes small and say what you \
changed and why. Never commit or push unless asked.";
