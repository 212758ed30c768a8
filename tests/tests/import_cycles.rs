//! No import circles between the files of a crate.
//!
//! Every crate of the workspace is parsed (`src/**/*.rs`, from each crate root: `lib.rs`,
//! `main.rs`, `bin/*.rs`, following `mod` declarations), every path that names something of
//! the crate is mapped to the module file that defines it (`use crate::a::{b, c::d}`,
//! `crate::a::f()` in an expression or a type, `super::x`, `self::x`, a module brought in by
//! `use` and then used as `a::f()`, paths inside macro calls and attribute arguments; an item
//! named through a re-export, `pub use child::Item` or `pub use child::*`, goes to the file
//! that defines it, so a re-export cannot hide a circle), and the files' graph must have no
//! strongly connected component of more than one file.
//!
//! Not edges: a module naming its own children (a parent owns its subtree), an item of your
//! own reached through a parent's re-export of it, an item another crate defines (re-exported
//! or not), and anything inside a `#[cfg(test)]` item (test code may reach anywhere).
//!
//! Run it alone with `cargo test -p cairn-tests --test import_cycles`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::{self, Visit};

/// A module's path inside its crate (`[]` is the crate root).
type ModPath = Vec<String>;

/// One use of a path in a module: the segments as written and where it was seen.
#[derive(Debug, Clone)]
struct Mention {
    module: ModPath,
    segments: Vec<String>,
    kind: Kind,
}

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    /// `use a::b;` or `use a::b as c;` (the name it binds).
    Use(String),
    /// `use a::b::*;`
    Glob,
    /// A path in code, a macro's tokens or an attribute.
    Code,
}

#[derive(Debug, Default)]
struct Module {
    /// The file (relative to `src/`) that holds the module.
    file: String,
    /// Names of the items defined in the module itself (not imported).
    items: BTreeSet<String>,
}

/// One crate target's module tree and every mention of a path in it.
#[derive(Debug, Default)]
struct Crate {
    modules: BTreeMap<ModPath, Module>,
    mentions: Vec<Mention>,
}

/// An import circle: the files, and for each edge between them one path that makes it.
#[derive(Debug, PartialEq)]
struct Circle {
    files: Vec<String>,
    edges: Vec<(String, String, String)>,
}

/// The circles among `files` (paths relative to the crate's `src/`, with their text), for
/// each crate root among them.
fn circles(files: &BTreeMap<String, String>) -> Result<Vec<Circle>, String> {
    let mut found = Vec::new();
    for root in files.keys().filter(|f| is_root(f)) {
        let krate = load(files, root)?;
        for circle in find_circles(&krate) {
            if !found.contains(&circle) {
                found.push(circle);
            }
        }
    }
    Ok(found)
}

fn is_root(file: &str) -> bool {
    match file.split('/').collect::<Vec<_>>()[..] {
        ["lib.rs"] | ["main.rs"] | ["bin", _] => file.ends_with(".rs"),
        ["bin", _, "main.rs"] => true,
        _ => false,
    }
}

// ---------------------------------------------------------------------------------------
// Loading: the module tree and the mentions.

fn load(files: &BTreeMap<String, String>, root: &str) -> Result<Crate, String> {
    let mut krate = Crate::default();
    // (file, module path, directory its `mod x;` children live in)
    let root_dir = parent_dir(root);
    let mut queue = vec![(root.to_string(), ModPath::new(), root_dir)];
    while let Some((file, module, dir)) = queue.pop() {
        let text = files
            .get(&file)
            .ok_or_else(|| format!("{file}: declared as a module but not found"))?;
        let ast = syn::parse_file(text).map_err(|e| format!("{file}: {e}"))?;
        let mut walker = Walker {
            file: file.clone(),
            stack: vec![(module, dir)],
            krate: &mut krate,
            files,
            declared: Vec::new(),
        };
        walker.enter_module(&ast.items);
        queue.extend(walker.declared);
    }
    Ok(krate)
}

fn parent_dir(file: &str) -> String {
    match file.rfind('/') {
        Some(i) => file[..=i].to_string(),
        None => String::new(),
    }
}

struct Walker<'a> {
    file: String,
    /// The module being walked and the directory of its `mod x;` children, innermost last.
    stack: Vec<(ModPath, String)>,
    krate: &'a mut Crate,
    files: &'a BTreeMap<String, String>,
    /// Modules declared `mod x;` in this file, to load next.
    declared: Vec<(String, ModPath, String)>,
}

impl Walker<'_> {
    fn module(&self) -> &ModPath {
        &self.stack.last().expect("a module is being walked").0
    }

    fn mention(&mut self, segments: Vec<String>, kind: Kind) {
        if !segments.is_empty() {
            let module = self.module().clone();
            self.krate.mentions.push(Mention {
                module,
                segments,
                kind,
            });
        }
    }

    /// Records a module's own items, then walks them.
    fn enter_module(&mut self, items: &[syn::Item]) {
        let module = self.module().clone();
        let entry = self.krate.modules.entry(module).or_default();
        entry.file.clone_from(&self.file);
        for item in items.iter().filter(|item| !is_test_only(item_attrs(item))) {
            if let Some(name) = item_name(item) {
                entry.items.insert(name);
            }
        }
        for item in items {
            self.visit_item(item);
        }
    }

    fn declare(&mut self, item: &syn::ItemMod) {
        let (module, dir) = self.stack.last().expect("a module is being walked").clone();
        let name = item.ident.to_string();
        let mut child = module;
        child.push(name.clone());
        let (file, child_dir) = match path_attr(&item.attrs) {
            // Relative to the declaring file's directory; the file then acts like a `mod.rs`.
            Some(path) => {
                let file = normalize(&format!("{}{path}", parent_dir(&self.file)));
                let dir = parent_dir(&file);
                (file, dir)
            }
            None => {
                let flat = format!("{dir}{name}.rs");
                if self.files.contains_key(&flat) {
                    (flat, format!("{dir}{name}/"))
                } else {
                    (format!("{dir}{name}/mod.rs"), format!("{dir}{name}/"))
                }
            }
        };
        self.declared.push((file, child, child_dir));
    }
}

/// Resolves `.` and `..` in a relative path.
fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "." | "" => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    parts.join("/")
}

impl<'ast> Visit<'ast> for Walker<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !is_test_only(item_attrs(item)) {
            visit::visit_item(self, item);
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs = match item {
            syn::ImplItem::Const(i) => &i.attrs,
            syn::ImplItem::Fn(i) => &i.attrs,
            syn::ImplItem::Type(i) => &i.attrs,
            syn::ImplItem::Macro(i) => &i.attrs,
            _ => return visit::visit_impl_item(self, item),
        };
        if !is_test_only(attrs) {
            visit::visit_impl_item(self, item);
        }
    }

    fn visit_trait_item(&mut self, item: &'ast syn::TraitItem) {
        let attrs = match item {
            syn::TraitItem::Const(i) => &i.attrs,
            syn::TraitItem::Fn(i) => &i.attrs,
            syn::TraitItem::Type(i) => &i.attrs,
            syn::TraitItem::Macro(i) => &i.attrs,
            _ => return visit::visit_trait_item(self, item),
        };
        if !is_test_only(attrs) {
            visit::visit_trait_item(self, item);
        }
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        for attr in &item.attrs {
            self.visit_attribute(attr);
        }
        match &item.content {
            None => self.declare(item),
            Some((_, items)) => {
                let (module, dir) = self.stack.last().expect("a module is being walked").clone();
                let name = item.ident.to_string();
                let mut child = module;
                child.push(name.clone());
                self.stack.push((child, format!("{dir}{name}/")));
                self.enter_module(items);
                self.stack.pop();
            }
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        if item.leading_colon.is_some() {
            return;
        }
        let mut found = Vec::new();
        flatten_use(&item.tree, &mut Vec::new(), &mut found);
        for (segments, kind) in found {
            self.mention(segments, kind);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() {
            let segments = path.segments.iter().map(|s| s.ident.to_string()).collect();
            self.mention(segments, Kind::Code);
        }
        visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        self.scan_tokens(mac.tokens.clone());
    }

    fn visit_attribute(&mut self, attr: &'ast syn::Attribute) {
        if attr.path().is_ident("doc") {
            // Prose may name a module (`crate::idle`) without using it.
            return;
        }
        match &attr.meta {
            syn::Meta::List(list) => self.scan_tokens(list.tokens.clone()),
            syn::Meta::NameValue(nv) => self.visit_expr(&nv.value),
            syn::Meta::Path(_) => {}
        }
    }

    fn visit_lit_str(&mut self, lit: &'ast syn::LitStr) {
        // `#[serde(with = "crate::x")]`, `#[serde(default = "crate::x::f")]`.
        if let Ok(path) = lit.parse::<syn::Path>()
            && path.segments.len() > 1
        {
            self.visit_path(&path);
        }
    }

    // `pub(in crate::a)` names where an item is visible, not something it uses.
    fn visit_vis_restricted(&mut self, _: &'ast syn::VisRestricted) {}
}

impl Walker<'_> {
    /// Paths inside a macro call or an attribute's arguments (`a::b::c`, `$crate::a`, string
    /// literals that are paths).
    fn scan_tokens(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < tokens.len() {
            match &tokens[i] {
                TokenTree::Group(group) => {
                    self.scan_tokens(group.stream());
                    i += 1;
                }
                TokenTree::Literal(lit) => {
                    let text = lit.to_string();
                    if let Some(inner) = text.strip_prefix('"').and_then(|t| t.strip_suffix('"'))
                        && let Ok(path) = syn::parse_str::<syn::Path>(inner)
                        && path.segments.len() > 1
                        && path.leading_colon.is_none()
                    {
                        let segments = path.segments.iter().map(|s| s.ident.to_string());
                        self.mention(segments.collect(), Kind::Code);
                    }
                    i += 1;
                }
                TokenTree::Ident(ident) => {
                    let after_colons = i >= 2 && is_colon_pair(&tokens[i - 2], &tokens[i - 1]);
                    let mut segments = vec![ident.to_string()];
                    let mut j = i + 1;
                    while j + 2 < tokens.len() && is_colon_pair(&tokens[j], &tokens[j + 1]) {
                        match &tokens[j + 2] {
                            TokenTree::Ident(next) => segments.push(next.to_string()),
                            _ => break,
                        }
                        j += 3;
                    }
                    if segments.len() > 1 && !after_colons {
                        self.mention(segments, Kind::Code);
                    }
                    i = j.max(i + 1);
                }
                TokenTree::Punct(_) => i += 1,
            }
        }
    }
}

fn is_colon_pair(a: &TokenTree, b: &TokenTree) -> bool {
    matches!((a, b), (TokenTree::Punct(a), TokenTree::Punct(b))
        if a.as_char() == ':' && b.as_char() == ':' && a.spacing() == proc_macro2::Spacing::Joint)
}

fn flatten_use(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<(Vec<String>, Kind)>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten_use(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let mut segments = prefix.clone();
            if n.ident == "self" {
                let name = prefix.last().cloned().unwrap_or_default();
                out.push((segments, Kind::Use(name)));
            } else {
                segments.push(n.ident.to_string());
                out.push((segments, Kind::Use(n.ident.to_string())));
            }
        }
        syn::UseTree::Rename(r) => {
            let mut segments = prefix.clone();
            if r.ident != "self" {
                segments.push(r.ident.to_string());
            }
            out.push((segments, Kind::Use(r.rename.to_string())));
        }
        syn::UseTree::Glob(_) => out.push((prefix.clone(), Kind::Glob)),
        syn::UseTree::Group(g) => {
            for tree in &g.items {
                flatten_use(tree, prefix, out);
            }
        }
    }
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::ExternCrate(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::ForeignMod(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::TraitAlias(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

fn item_name(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(i) => &i.ident,
        syn::Item::Enum(i) => &i.ident,
        syn::Item::Fn(i) => &i.sig.ident,
        syn::Item::Macro(i) => i.ident.as_ref()?,
        syn::Item::Mod(i) => &i.ident,
        syn::Item::Static(i) => &i.ident,
        syn::Item::Struct(i) => &i.ident,
        syn::Item::Trait(i) => &i.ident,
        syn::Item::TraitAlias(i) => &i.ident,
        syn::Item::Type(i) => &i.ident,
        syn::Item::Union(i) => &i.ident,
        _ => return None,
    };
    Some(ident.to_string())
}

/// `#[cfg(test)]`: compiled only into the crate's own unit tests.
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && matches!(&attr.meta, syn::Meta::List(list) if list.tokens.to_string() == "test")
    })
}

/// `#[path = "x.rs"]` on a module declaration.
fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|attr| match &attr.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

// ---------------------------------------------------------------------------------------
// Resolving: which module file each mention goes through.

struct Resolver<'a> {
    krate: &'a Crate,
    /// Names bound to a module by `use` (`use crate::a::b;` binds `b`), per module.
    aliases: BTreeMap<(ModPath, String), ModPath>,
    /// Modules glob-imported by a module (`use super::*;`).
    globs: BTreeMap<ModPath, Vec<ModPath>>,
}

impl<'a> Resolver<'a> {
    fn new(krate: &'a Crate) -> Self {
        let mut resolver = Resolver {
            krate,
            aliases: BTreeMap::new(),
            globs: BTreeMap::new(),
        };
        // Aliases may be built on aliases (`use crate::a; use a::b;`): repeat until stable.
        loop {
            let mut changed = false;
            for mention in &krate.mentions {
                let Some((target, rest)) = resolver.resolve(&mention.module, &mention.segments)
                else {
                    continue;
                };
                if !rest.is_empty() {
                    continue;
                }
                match &mention.kind {
                    Kind::Use(name) => {
                        let key = (mention.module.clone(), name.clone());
                        if resolver.aliases.get(&key) != Some(&target) {
                            resolver.aliases.insert(key, target);
                            changed = true;
                        }
                    }
                    Kind::Glob => {
                        let globs = resolver.globs.entry(mention.module.clone()).or_default();
                        if !globs.contains(&target) {
                            globs.push(target);
                            changed = true;
                        }
                    }
                    Kind::Code => {}
                }
            }
            if !changed {
                return resolver;
            }
        }
    }

    fn is_module(&self, path: &ModPath) -> bool {
        self.krate.modules.contains_key(path)
    }

    /// The deepest module of the crate a path goes through, and the segments after it;
    /// `None` for a path that starts outside the crate (another crate, a local name).
    fn resolve<'s>(
        &self,
        module: &ModPath,
        segments: &'s [String],
    ) -> Option<(ModPath, &'s [String])> {
        let (first, mut rest) = segments.split_first()?;
        let mut base = match first.as_str() {
            "crate" => ModPath::new(),
            "self" => module.clone(),
            "super" => {
                let mut base = module.clone();
                base.pop()?;
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
                base
            }
            name => self.lookup(module, name)?,
        };
        while let Some((next, after)) = rest.split_first() {
            let mut deeper = base.clone();
            deeper.push(next.clone());
            if !self.is_module(&deeper) {
                break;
            }
            base = deeper;
            rest = after;
        }
        Some((base, rest))
    }

    /// A module named by a bare name in `module`: a child, a `use`d module, or a child of a
    /// glob-imported module.
    fn lookup(&self, module: &ModPath, name: &str) -> Option<ModPath> {
        let mut child = module.clone();
        child.push(name.to_string());
        if self.is_module(&child) {
            return Some(child);
        }
        if let Some(target) = self.aliases.get(&(module.clone(), name.to_string())) {
            return Some(target.clone());
        }
        self.globs.get(module)?.iter().find_map(|glob| {
            let mut child = glob.clone();
            child.push(name.to_string());
            self.is_module(&child).then_some(child)
        })
    }

    /// The module that defines the item `name` seen in `module`, following re-exports
    /// (`pub use a::Name;`, `pub use a::*;`) inside the crate; `None` when it comes from
    /// another crate (`pub use cairn_engine::provider::*;`).
    fn owner(&self, module: &ModPath, name: &str, depth: usize) -> Option<ModPath> {
        if depth > 16 || self.krate.modules[module].items.contains(name) {
            return Some(module.clone());
        }
        let mut from_glob = None;
        let mut extern_glob = false;
        for mention in self.krate.mentions.iter().filter(|m| &m.module == module) {
            match (&mention.kind, self.resolve(module, &mention.segments)) {
                (Kind::Use(bound), source) if bound == name => {
                    let (source, rest) = source?;
                    return match rest {
                        [item] => self.owner(&source, item, depth + 1),
                        _ => Some(source),
                    };
                }
                (Kind::Glob, Some((source, []))) if from_glob.is_none() => {
                    let owner = self.owner(&source, name, depth + 1);
                    if owner.as_ref() != Some(&source)
                        || self.krate.modules[&source].items.contains(name)
                    {
                        from_glob = owner;
                    }
                }
                (Kind::Glob, None) => extern_glob = true,
                _ => {}
            }
        }
        match from_glob {
            Some(owner) => Some(owner),
            None if extern_glob => None,
            None => Some(module.clone()),
        }
    }
}

/// The files' graph: for each edge, the first path seen that makes it.
fn edges(krate: &Crate) -> BTreeMap<(String, String), String> {
    let resolver = Resolver::new(krate);
    // A file's own module: the outermost module it holds (its inline modules are inside).
    let mut homes: BTreeMap<&str, &ModPath> = BTreeMap::new();
    for (path, module) in &krate.modules {
        let home = homes.entry(module.file.as_str()).or_insert(path);
        if path.len() < home.len() {
            *home = path;
        }
    }
    let mut edges = BTreeMap::new();
    for mention in &krate.mentions {
        let Some((target, rest)) = resolver.resolve(&mention.module, &mention.segments) else {
            continue;
        };
        if rest.is_empty() && matches!(mention.kind, Kind::Use(_)) {
            // `use crate::a::b;` only names the module; using `b::x` is the dependency.
            continue;
        }
        // An item goes to the file that defines it, through any re-exports.
        let owner = match rest.first() {
            Some(name) => match resolver.owner(&target, name, 0) {
                Some(owner) => owner,
                None => continue,
            },
            None => target,
        };
        let from = &krate.modules[&mention.module].file;
        let to = &krate.modules[&owner].file;
        let home = homes[from.as_str()];
        if from == to || owner.starts_with(home) {
            continue;
        }
        edges
            .entry((from.clone(), to.clone()))
            .or_insert_with(|| mention.segments.join("::"));
    }
    edges
}

fn find_circles(krate: &Crate) -> Vec<Circle> {
    let edges = edges(krate);
    let mut graph: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        graph.entry(from).or_default().push(to);
        graph.entry(to).or_default();
    }
    strongly_connected(&graph)
        .into_iter()
        .filter(|component| component.len() > 1)
        .map(|component| {
            let inside = |f: &String| component.contains(&f.as_str());
            Circle {
                files: component.iter().map(|f| f.to_string()).collect(),
                edges: edges
                    .iter()
                    .filter(|((from, to), _)| inside(from) && inside(to))
                    .map(|((from, to), path)| (from.clone(), to.clone(), path.clone()))
                    .collect(),
            }
        })
        .collect()
}

/// Tarjan's strongly connected components, each sorted.
fn strongly_connected<'a>(graph: &BTreeMap<&'a str, Vec<&'a str>>) -> Vec<Vec<&'a str>> {
    struct State<'a> {
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        components: Vec<Vec<&'a str>>,
    }
    fn connect<'a>(node: &'a str, graph: &BTreeMap<&'a str, Vec<&'a str>>, s: &mut State<'a>) {
        let index = s.index.len();
        s.index.insert(node, index);
        s.low.insert(node, index);
        s.stack.push(node);
        s.on_stack.insert(node);
        for &next in &graph[node] {
            if !s.index.contains_key(next) {
                connect(next, graph, s);
                let low = s.low[node].min(s.low[next]);
                s.low.insert(node, low);
            } else if s.on_stack.contains(next) {
                let low = s.low[node].min(s.index[next]);
                s.low.insert(node, low);
            }
        }
        if s.low[node] == s.index[node] {
            let mut component = Vec::new();
            while let Some(member) = s.stack.pop() {
                s.on_stack.remove(member);
                component.push(member);
                if member == node {
                    break;
                }
            }
            component.sort_unstable();
            s.components.push(component);
        }
    }
    let mut state = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        components: Vec::new(),
    };
    for &node in graph.keys() {
        if !state.index.contains_key(node) {
            connect(node, graph, &mut state);
        }
    }
    state.components
}

// ---------------------------------------------------------------------------------------
// The workspace.

/// Every crate directory of the repository (a `Cargo.toml` beside a `src/`).
fn crate_dirs(dir: &Path, found: &mut Vec<PathBuf>) {
    if dir.join("Cargo.toml").is_file() && dir.join("src").is_dir() {
        found.push(dir.to_path_buf());
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if path.is_dir() && !name.starts_with('.') && name != "target" && name != "node_modules" {
            crate_dirs(&path, found);
        }
    }
}

fn rust_files(src: &Path, dir: &Path, files: &mut BTreeMap<String, String>) {
    for entry in std::fs::read_dir(dir)
        .expect("a source directory reads")
        .flatten()
    {
        let path = entry.path();
        if path.is_dir() {
            rust_files(src, &path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path.strip_prefix(src).expect("under src/");
            let relative = relative.to_string_lossy().replace('\\', "/");
            let text = std::fs::read_to_string(&path).expect("a source file reads");
            files.insert(relative, text);
        }
    }
}

#[test]
fn no_crate_has_an_import_circle() {
    let root = cairn_tests::repo_root();
    let mut dirs = Vec::new();
    crate_dirs(&root, &mut dirs);
    assert!(
        dirs.len() >= 8,
        "the workspace's crates are found: {dirs:?}"
    );
    let mut report = String::new();
    for dir in dirs {
        let mut files = BTreeMap::new();
        rust_files(&dir.join("src"), &dir.join("src"), &mut files);
        let name = dir
            .strip_prefix(&root)
            .unwrap_or(&dir)
            .display()
            .to_string();
        for circle in circles(&files).unwrap_or_else(|e| panic!("{name}: {e}")) {
            report += &format!(
                "\n{name}/src: {} files import each other:\n",
                circle.files.len()
            );
            for (from, to, path) in circle.edges {
                report += &format!("    {from} -> {to}  ({path})\n");
            }
        }
    }
    assert!(
        report.is_empty(),
        "import circles (move the shared item to the module that owns it):{report}"
    );
}

// ---------------------------------------------------------------------------------------
// The checker itself.

fn crate_of(files: &[(&str, &str)]) -> BTreeMap<String, String> {
    files
        .iter()
        .map(|(path, text)| (path.to_string(), text.to_string()))
        .collect()
}

fn circle_files(files: &[(&str, &str)]) -> Vec<Vec<String>> {
    let found = circles(&crate_of(files)).expect("the planted crate parses");
    found.into_iter().map(|c| c.files).collect()
}

#[test]
fn a_planted_circle_through_use_and_an_expression_is_found() {
    let found = circles(&crate_of(&[
        ("lib.rs", "pub mod a; pub mod b; mod c;"),
        ("a.rs", "use crate::b::Thing; pub fn f() -> Thing { Thing }"),
        ("b.rs", "pub struct Thing; pub fn g() { crate::a::f(); }"),
        ("c.rs", "use crate::a; pub fn h() { a::f(); }"),
    ]))
    .expect("parses");
    assert_eq!(
        found,
        vec![Circle {
            files: vec!["a.rs".into(), "b.rs".into()],
            edges: vec![
                ("a.rs".into(), "b.rs".into(), "crate::b::Thing".into()),
                ("b.rs".into(), "a.rs".into(), "crate::a::f".into()),
            ],
        }]
    );
}

#[test]
fn groups_super_nested_modules_and_aliases_are_followed() {
    // session/mod.rs -> config.rs -> provider/live.rs -> session/mod.rs
    let found = circle_files(&[
        (
            "lib.rs",
            "pub mod config; pub mod provider; pub mod session;",
        ),
        (
            "config.rs",
            "use crate::{provider::{self, live::Live}, session as s};\n pub struct Config(Live);",
        ),
        ("provider/mod.rs", "pub mod live;"),
        (
            "provider/live.rs",
            "pub struct Live; fn f() -> super::super::session::Session { todo!() }",
        ),
        (
            "session/mod.rs",
            "mod turn; pub struct Session; fn c(x: &crate::config::Config) {}",
        ),
        ("session/turn.rs", "use super::Session;"),
    ]);
    assert_eq!(
        found,
        vec![vec!["config.rs", "provider/live.rs", "session/mod.rs"]]
    );
}

#[test]
fn paths_in_macros_and_attributes_count() {
    let found = circle_files(&[
        ("main.rs", "mod a; mod b;"),
        ("a.rs", "pub fn f() { tracing::info!(x = ?crate::b::G); }"),
        (
            "b.rs",
            "pub static G: u8 = 0; #[derive(serde::Deserialize)] struct S { #[serde(default = \"crate::a::f\")] x: u8 }",
        ),
    ]);
    assert_eq!(found, vec![vec!["a.rs", "b.rs"]]);
}

#[test]
fn test_code_children_and_own_reexports_are_not_edges() {
    let found = circle_files(&[
        ("lib.rs", "pub mod a; pub mod b; pub mod parent;"),
        // b needs a; a reaches b only from its unit tests.
        (
            "a.rs",
            "pub fn f() {}\n#[cfg(test)]\nmod tests { use crate::b::g; }\n#[cfg(test)] mod more;",
        ),
        ("a/more.rs", "use crate::b::g;"),
        ("b.rs", "pub fn g() { crate::a::f(); }"),
        // A parent re-exports and names its children; the children name their own items
        // through the parent.
        (
            "parent/mod.rs",
            "mod one; mod two; pub use self::one::*; pub use two::Two; fn p() { one::One; }",
        ),
        (
            "parent/one.rs",
            "pub struct One; fn o() -> crate::parent::One { One }",
        ),
        ("parent/two.rs", "pub struct Two; fn t(_: super::Two) {}"),
    ]);
    assert_eq!(found, Vec::<Vec<String>>::new());
}

#[test]
fn a_parent_module_and_another_file_naming_each_other_is_a_circle() {
    let found = circle_files(&[
        ("lib.rs", "pub mod p; pub mod q;"),
        ("p/mod.rs", "mod c; pub struct Own; fn f(_: crate::q::Q) {}"),
        ("p/c.rs", "pub struct C(super::Own);"),
        ("q.rs", "pub struct Q; fn g(_: crate::p::Own) {}"),
    ]);
    assert_eq!(found, vec![vec!["p/mod.rs", "q.rs"]]);
}

#[test]
fn an_item_goes_to_the_file_that_defines_it_through_reexports() {
    let reexported = [
        ("lib.rs", "pub mod p; pub mod q;"),
        (
            "p/mod.rs",
            "mod a; mod b; pub use a::A; pub use b::*; pub use other::Foreign;",
        ),
        ("p/a.rs", "pub struct A(crate::q::Q);"),
        ("p/b.rs", "pub struct B;"),
        ("q.rs", "pub struct Q; fn f(_: crate::p::A) {}"),
    ];
    assert_eq!(circle_files(&reexported), vec![vec!["p/a.rs", "q.rs"]]);

    // p/mod.rs itself needs q, and q names only items p re-exports from elsewhere.
    let elsewhere = [
        ("lib.rs", "pub mod p; pub mod q;"),
        (
            "p/mod.rs",
            "mod b; pub use b::*; pub use other::Foreign; fn f(_: crate::q::Q) {}",
        ),
        ("p/b.rs", "pub struct B;"),
        (
            "q.rs",
            "pub struct Q; fn g(_: crate::p::B, _: crate::p::Foreign) {}",
        ),
    ];
    assert_eq!(circle_files(&elsewhere), Vec::<Vec<String>>::new());
}
