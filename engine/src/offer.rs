//! What tool catalog a request offers when the whole one would crowd out the conversation.
//!
//! Every request carries the catalog, and no compaction can shrink it: on a small window a
//! large MCP server's catalog alone can exceed what the window leaves for the history. The
//! catalog then gets [`room`] (a share of the history budget, less the system prompt) and
//! [`plan`] decides, tool by tool, what fits it: first the descriptions of tools that were
//! not used recently are shortened ([`shorten`]), then such tools are deferred behind the
//! built-in [`TOOL_SEARCH`] tool, which returns the full definitions of the deferred tools
//! that match a query ([`search`]); a tool the model found or called recently is kept whole
//! as long as anything else can give way. Only tools that may give way (an MCP server's)
//! are ever shortened or deferred; the session's own tools and an API client's stay whole.
//!
//! Everything here is plain data in, plain data out; the agent performs the plan.

use serde::Serialize;
use serde_json::{Value, json};

use cairn_crds::EffectivePolicy;

use crate::compact::{Budget, BudgetInputs, SessionState};
use crate::provider::ToolSpec;

/// The built-in tool that finds deferred tools.
pub const TOOL_SEARCH: &str = "tool_search";

/// Share of the history budget the tool catalog may take before it gives way: the
/// conversation keeps at least the rest.
pub const CATALOG_SHARE: f64 = 0.5;

/// Deferred tools one search returns at most.
pub const SEARCH_LIMIT: usize = 5;

/// Bytes a shortened description keeps at most (its first sentence, cut at a word).
pub const SHORT_DESCRIPTION_BYTES: usize = 80;

/// One tool of the full catalog, as [`plan`] weighs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    /// Bytes of the whole definition ([`ToolSpec::weight`]).
    pub whole: usize,
    /// Bytes of its shortened definition ([`shorten`]).
    pub short: usize,
    /// It may be shortened or deferred (an MCP server's tool).
    pub yields: bool,
}

impl Candidate {
    /// The candidate of `spec`; `yields` says whether it may give way.
    pub fn of(spec: &ToolSpec, yields: bool) -> Self {
        Self {
            name: spec.name.clone(),
            whole: spec.weight(),
            short: shorten(spec).weight(),
            yields,
        }
    }
}

/// How one tool is offered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Offer {
    Whole,
    /// With its shortened definition.
    Short,
    /// Not offered; [`TOOL_SEARCH`] finds it, and a direct call of it still runs.
    Deferred,
}

/// What [`plan`] decided: each tool's offer, in the catalog's order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub offers: Vec<(String, Offer)>,
    /// Bytes the offered catalog weighs, the search tool included when it is offered.
    pub bytes: usize,
    /// Bytes the whole catalog weighs.
    pub whole_bytes: usize,
    /// The room it was planned for.
    pub room: usize,
}

impl Plan {
    /// The offer of `name` (`Whole` for a tool the plan does not know).
    pub fn offer(&self, name: &str) -> Offer {
        self.offers
            .iter()
            .find(|(n, _)| n == name)
            .map_or(Offer::Whole, |(_, o)| *o)
    }

    /// Names of the tools offered `offer`, in the catalog's order.
    pub fn named(&self, offer: Offer) -> Vec<String> {
        self.offers
            .iter()
            .filter(|(_, o)| *o == offer)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Some tool is deferred: the search tool is offered.
    pub fn searches(&self) -> bool {
        self.offers.iter().any(|(_, o)| *o == Offer::Deferred)
    }

    /// Every tool is offered whole.
    pub fn is_whole(&self) -> bool {
        self.offers.iter().all(|(_, o)| *o == Offer::Whole)
    }

    /// The counts and bytes the context inspector and the status show.
    pub fn report(&self) -> CatalogReport {
        CatalogReport {
            whole_bytes: self.whole_bytes as u64,
            offered_bytes: self.bytes as u64,
            room_bytes: self.room as u64,
            shortened: self.named(Offer::Short),
            deferred: self.named(Offer::Deferred),
        }
    }
}

/// The tool catalog of a request as the context inspector shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CatalogReport {
    /// Bytes of the whole catalog.
    pub whole_bytes: u64,
    /// Bytes of the catalog the request offers (the search tool included).
    pub offered_bytes: u64,
    /// Bytes the catalog may take.
    pub room_bytes: u64,
    /// Tools offered with a shortened description.
    pub shortened: Vec<String>,
    /// Tools deferred behind the search tool.
    pub deferred: Vec<String>,
}

/// Bytes the catalog may take: [`CATALOG_SHARE`] of the history budget (the window, the
/// session's bytes per token and any payload cap, less `inputs.reserve_bytes`, which holds
/// what else every request carries), less the system prompt's `system_bytes`.
pub fn room(
    inputs: &BudgetInputs,
    policy: &EffectivePolicy,
    state: &SessionState,
    system_bytes: usize,
) -> usize {
    let budget = Budget::compute(inputs, policy, state).chars;
    ((budget as f64 * CATALOG_SHARE) as usize).saturating_sub(system_bytes)
}

/// What fits `room`: every tool whole when the whole catalog does; else, in this order until
/// it fits, the tools that yield and are not in `recent` are shortened, then deferred
/// (largest first), then the recent ones are shortened and deferred (least recent first).
/// `recent` lists the tools called or found lately, most recent first. Deferring adds the
/// search tool's `search_bytes` once. When even that is over the room, the smallest catalog
/// is the plan (the turn's floor check then says what cannot fit).
pub fn plan(catalog: &[Candidate], recent: &[String], search_bytes: usize, room: usize) -> Plan {
    let whole_bytes = catalog.iter().map(|c| c.whole).sum();
    let mut offers: Vec<Offer> = vec![Offer::Whole; catalog.len()];
    let weigh = |offers: &[Offer]| -> usize {
        let tools: usize = catalog
            .iter()
            .zip(offers)
            .map(|(c, o)| match o {
                Offer::Whole => c.whole,
                Offer::Short => c.short,
                Offer::Deferred => 0,
            })
            .sum();
        let search = if offers.contains(&Offer::Deferred) {
            search_bytes
        } else {
            0
        };
        tools + search
    };
    // Which tools give way first: those not used lately (largest first, so few go), then the
    // recent ones from the least recent.
    let recency = |name: &str| recent.iter().position(|r| r == name);
    let mut order: Vec<usize> = (0..catalog.len()).filter(|&i| catalog[i].yields).collect();
    order.sort_by(|&a, &b| {
        let (ca, cb) = (&catalog[a], &catalog[b]);
        match (recency(&ca.name), recency(&cb.name)) {
            (None, None) => cb.whole.cmp(&ca.whole).then(ca.name.cmp(&cb.name)),
            (None, Some(_)) => std::cmp::Ordering::Less,
            (Some(_), None) => std::cmp::Ordering::Greater,
            (Some(x), Some(y)) => y.cmp(&x),
        }
    });
    let (stale, fresh): (Vec<usize>, Vec<usize>) = order
        .iter()
        .partition(|&&i| recency(&catalog[i].name).is_none());
    // A group's descriptions are shortened all at once (a shortened tool is still offered;
    // a deferred one costs the model a search), its tools deferred one at a time.
    for group in [&stale, &fresh] {
        if weigh(&offers) <= room {
            break;
        }
        for &i in group {
            offers[i] = Offer::Short;
        }
        for &i in group {
            if weigh(&offers) <= room {
                break;
            }
            offers[i] = Offer::Deferred;
        }
    }
    let bytes = weigh(&offers);
    Plan {
        offers: catalog
            .iter()
            .zip(offers)
            .map(|(c, o)| (c.name.clone(), o))
            .collect(),
        bytes,
        whole_bytes,
        room,
    }
}

/// The shortened definition of `spec`: the first sentence of its description (at most
/// [`SHORT_DESCRIPTION_BYTES`], cut at a word) and its parameter schema without the
/// descriptions of its properties.
pub fn shorten(spec: &ToolSpec) -> ToolSpec {
    let mut parameters = spec.parameters.clone();
    strip_descriptions(&mut parameters);
    ToolSpec {
        name: spec.name.clone(),
        description: first_sentence(&spec.description),
        parameters,
    }
}

fn first_sentence(text: &str) -> String {
    let text = text.trim();
    let end = text
        .char_indices()
        .find(|&(i, c)| {
            matches!(c, '.' | '\n')
                && text[i + c.len_utf8()..]
                    .chars()
                    .next()
                    .is_none_or(char::is_whitespace)
        })
        .map_or(text.len(), |(i, c)| i + c.len_utf8());
    let sentence = text[..end].trim_end_matches('\n').trim();
    if sentence.len() <= SHORT_DESCRIPTION_BYTES {
        return sentence.to_owned();
    }
    let mut cut = SHORT_DESCRIPTION_BYTES;
    while !sentence.is_char_boundary(cut) {
        cut -= 1;
    }
    let head = &sentence[..cut];
    let head = head.rfind(' ').map_or(head, |at| &head[..at]);
    format!("{}…", head.trim_end())
}

/// Removes `description` from every property schema (the schema's own keys stay).
fn strip_descriptions(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            if let Some(Value::Object(props)) = map.get_mut("properties") {
                for prop in props.values_mut() {
                    if let Value::Object(p) = prop {
                        p.remove("description");
                    }
                    strip_descriptions(prop);
                }
            }
            if let Some(items) = map.get_mut("items") {
                if let Value::Object(i) = items {
                    i.remove("description");
                }
                strip_descriptions(items);
            }
        }
        Value::Array(list) => list.iter_mut().for_each(strip_descriptions),
        _ => {}
    }
}

/// The search tool's definition.
pub fn search_tool() -> ToolSpec {
    ToolSpec {
        name: TOOL_SEARCH.into(),
        description: "Find tools that are not listed: returns the full definitions of the matching ones, which you can then call.".into(),
        parameters: json!({
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"]
        }),
    }
}

/// The deferred tools that match `query`, best first, at most [`SEARCH_LIMIT`]: a tool
/// scores one per word of the query (two or more letters) found in its name or description,
/// a word of its name counting twice. A query naming no tool's words matches none.
pub fn search<'a>(deferred: &'a [ToolSpec], query: &str) -> Vec<&'a ToolSpec> {
    let words: Vec<String> = terms(query);
    let mut scored: Vec<(usize, &ToolSpec)> = deferred
        .iter()
        .filter_map(|t| {
            let name = terms(&t.name);
            let text = t.description.to_lowercase();
            let score: usize = words
                .iter()
                .map(|w| {
                    if name.iter().any(|n| n == w || n.starts_with(w.as_str())) {
                        2
                    } else {
                        usize::from(text.contains(w.as_str()))
                    }
                })
                .sum();
            (score > 0).then_some((score, t))
        })
        .collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.name.cmp(&b.1.name)));
    scored
        .into_iter()
        .take(SEARCH_LIMIT)
        .map(|(_, t)| t)
        .collect()
}

/// Lower-case words of two or more letters or digits (`read_text_file` → read, text, file).
fn terms(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.len() >= 2)
        .map(str::to_lowercase)
        .collect()
}

/// The text [`TOOL_SEARCH`] answers with: the found tools' full definitions as JSON, or why
/// none matched.
pub fn search_result(found: &[&ToolSpec], query: &str, deferred: &[ToolSpec]) -> String {
    if found.is_empty() {
        let names: Vec<&str> = deferred.iter().map(|t| t.name.as_str()).collect();
        return format!("no tool matches {query:?}; the tools to be found are: {names:?}");
    }
    let tools: Vec<Value> = found
        .iter()
        .map(|t| json!({"name": t.name, "description": t.description, "parameters": t.parameters}))
        .collect();
    format!(
        "These tools are now available; call them by name.\n{}",
        Value::Array(tools)
    )
}

/// The notice of a catalog that gave way.
pub fn notice(plan: &Plan) -> String {
    let shortened = plan.named(Offer::Short).len();
    let deferred = plan.named(Offer::Deferred).len();
    format!(
        "the tool catalog ({} bytes) would crowd out the conversation (room {} bytes): {shortened} tool descriptions shortened, {deferred} tools deferred behind {TOOL_SEARCH}; the request offers {} bytes",
        plan.whole_bytes, plan.room, plan.bytes
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, whole: usize, short: usize, yields: bool) -> Candidate {
        Candidate {
            name: name.into(),
            whole,
            short,
            yields,
        }
    }

    fn catalog() -> Vec<Candidate> {
        vec![
            tool("recall", 300, 300, false),
            tool("read_text_file", 900, 200, true),
            tool("write_file", 700, 150, true),
            tool("list_directory", 500, 120, true),
            tool("search_files", 800, 180, true),
        ]
    }

    fn recent(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn a_catalog_that_fits_is_offered_whole() {
        let p = plan(&catalog(), &[], 100, 3_200);
        assert!(p.is_whole() && !p.searches());
        assert_eq!((p.bytes, p.whole_bytes), (3_200, 3_200));
    }

    #[test]
    fn descriptions_of_tools_not_used_lately_are_shortened_first() {
        // Whole: 3,200. Shortening the three stale ones leaves 300 + 900 + 450 = 1,650.
        let p = plan(&catalog(), &recent(&["read_text_file"]), 100, 2_000);
        assert_eq!(p.offer("read_text_file"), Offer::Whole);
        assert_eq!(p.offer("recall"), Offer::Whole);
        assert_eq!(
            p.named(Offer::Short),
            ["write_file", "list_directory", "search_files"]
        );
        assert!(!p.searches());
        assert_eq!(p.bytes, 1_650);
    }

    #[test]
    fn stale_tools_are_deferred_behind_the_search_tool_largest_first() {
        // Shortened: 1,650. Deferring search_files (180) then write_file (150) with the
        // search tool (100): 1,650 - 330 + 100 = 1,420.
        let p = plan(&catalog(), &recent(&["read_text_file"]), 100, 1_450);
        assert_eq!(p.named(Offer::Deferred), ["write_file", "search_files"]);
        assert_eq!(p.offer("list_directory"), Offer::Short);
        assert_eq!(p.offer("read_text_file"), Offer::Whole);
        assert!(p.searches());
        assert_eq!(p.bytes, 1_420);
        assert!(p.bytes <= p.room);
    }

    #[test]
    fn recent_tools_give_way_last_and_the_least_recent_first() {
        let recent = recent(&["write_file", "read_text_file"]);
        // Stale ones all deferred (300 + 900 + 700 + 100 = 2,000), then the recent ones
        // shortened (300 + 200 + 150 + 100 = 750).
        let p = plan(&catalog(), &recent, 100, 800);
        assert_eq!(p.named(Offer::Deferred), ["list_directory", "search_files"]);
        assert_eq!(p.named(Offer::Short), ["read_text_file", "write_file"]);
        // Tighter: the least recent (read_text_file) is deferred before the most recent.
        let p = plan(&catalog(), &recent, 100, 560);
        assert_eq!(p.offer("read_text_file"), Offer::Deferred);
        assert_eq!(p.offer("write_file"), Offer::Short);
        assert_eq!(p.bytes, 550);
    }

    #[test]
    fn tools_that_do_not_yield_stay_whole_even_when_nothing_fits() {
        let p = plan(&catalog(), &[], 100, 10);
        assert_eq!(p.offer("recall"), Offer::Whole);
        assert_eq!(
            p.named(Offer::Deferred),
            [
                "read_text_file",
                "write_file",
                "list_directory",
                "search_files"
            ]
        );
        assert_eq!(
            p.bytes, 400,
            "the smallest catalog: recall and the search tool"
        );
    }

    #[test]
    fn the_plan_depends_only_on_its_inputs() {
        let recent = recent(&["list_directory"]);
        assert_eq!(
            plan(&catalog(), &recent, 100, 1_000),
            plan(&catalog(), &recent, 100, 1_000)
        );
    }

    #[test]
    fn shortening_keeps_the_first_sentence_and_the_schema_without_descriptions() {
        let spec = ToolSpec {
            name: "read_text_file".into(),
            description: "Read the complete contents of a file from the file system as text. Handles various text encodings and provides detailed error messages.".into(),
            parameters: json!({"type": "object", "properties": {
                "path": {"type": "string"},
                "head": {"type": "number", "description": "If provided, returns only the first N lines of the file"}
            }, "required": ["path"]}),
        };
        let short = shorten(&spec);
        assert_eq!(
            short.description,
            "Read the complete contents of a file from the file system as text."
        );
        assert_eq!(
            short.parameters,
            json!({"type": "object", "properties": {"path": {"type": "string"}, "head": {"type": "number"}}, "required": ["path"]})
        );
        assert!(short.weight() < spec.weight());
        let long = ToolSpec {
            description: "word ".repeat(40),
            ..spec
        };
        let d = shorten(&long).description;
        assert!(d.len() <= SHORT_DESCRIPTION_BYTES + '…'.len_utf8(), "{d}");
        assert!(d.ends_with("word…"), "{d}");
    }

    #[test]
    fn search_finds_deferred_tools_by_name_and_description_words() {
        let spec = |name: &str, description: &str| ToolSpec {
            name: name.into(),
            description: description.into(),
            parameters: json!({"type": "object"}),
        };
        let deferred = vec![
            spec(
                "directory_tree",
                "Get a recursive tree view of files and directories.",
            ),
            spec(
                "list_directory",
                "Get a detailed listing of all files and directories.",
            ),
            spec("move_file", "Move or rename files and directories."),
            spec("get_file_info", "Retrieve detailed metadata about a file."),
        ];
        let names = |q: &str| -> Vec<String> {
            search(&deferred, q)
                .iter()
                .map(|t| t.name.clone())
                .collect()
        };
        assert_eq!(
            names("list directory"),
            ["list_directory", "directory_tree"]
        );
        assert_eq!(names("rename"), ["move_file"]);
        assert_eq!(names("metadata")[0], "get_file_info");
        assert!(names("weather forecast").is_empty());
        let found = search(&deferred, "tree");
        let text = search_result(&found, "tree", &deferred);
        assert!(text.contains("\"name\":\"directory_tree\"") && text.contains("\"parameters\""));
        let none = search_result(&[], "weather", &deferred);
        assert!(none.contains("move_file"), "{none}");
    }
}
