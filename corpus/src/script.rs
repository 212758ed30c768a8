//! What the recorder runs, as plain data: how the project's repository is built, the
//! commands whose output the corpus holds, and the edits whose diffs it holds. Part of the
//! cache key, so a changed script records again.

use crate::Topic;

/// A replacement of `old` (which must occur in the file) by `new` in the file at `path`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Edit {
    pub path: &'static str,
    pub old: &'static str,
    pub new: &'static str,
}

/// One step of building the repository the git commands look at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setup {
    /// A shell command run from the project root (not recorded).
    Shell(&'static str),
    Edit(Edit),
}

/// A command to record, run from the project root.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub topic: Topic,
    pub command: &'static str,
}

const fn step(topic: Topic, command: &'static str) -> Step {
    Step { topic, command }
}

/// The repository: three commits of imports, a feature branch and a commit on `main` that
/// touch the same line (so a cherry-pick conflicts).
pub const REPOSITORY: &[Setup] = &[
    Setup::Shell("git init -q -b main"),
    Setup::Shell(
        "git add .gitignore README.md rust python && git commit -q -m 'Import the ledger and inventory services'",
    ),
    Setup::Shell("git add go && git commit -q -m 'Add the shipping service'"),
    Setup::Shell(
        "git add node deploy patches && git commit -q -m 'Add the cart and the manifests'",
    ),
    Setup::Shell("git checkout -q -b feature/rounding"),
    Setup::Edit(Edit {
        path: "rust/src/money.rs",
        old: "            1 | 2 => frac.parse().ok()?,",
        new: "            1 => frac.parse::<i64>().ok()? * 10,\n            2 => frac.parse().ok()?,",
    }),
    Setup::Shell("git commit -q -am 'Parse one decimal as tenths'"),
    Setup::Shell("git checkout -q main"),
    Setup::Edit(Edit {
        path: "rust/src/money.rs",
        old: "            1 | 2 => frac.parse().ok()?,",
        new: "            1 | 2 => frac.parse().ok().filter(|f: &i64| *f >= 0)?,",
    }),
    Setup::Shell("git commit -q -am 'Reject negative fractions'"),
];

/// Commands that need no cluster, in the order they run.
pub const LOCAL: &[Step] = &[
    step(Topic::Git, "grep -rn TODO --exclude-dir=.git ."),
    step(
        Topic::Git,
        r"grep -rn 'fn balance\|def total_value\|func RateFor\|function taxFor' .",
    ),
    step(Topic::Kube, "grep -rn 'image:' deploy/"),
    step(Topic::Rust, "grep -rln Cents rust/"),
    step(Topic::Git, "git log --oneline"),
    step(Topic::Git, "git log --stat -n 3"),
    step(Topic::Git, "git diff HEAD~2 --stat"),
    step(Topic::Git, "git diff HEAD~1"),
    step(Topic::Git, "git show --stat HEAD"),
    step(Topic::Git, "git branch -a"),
    step(Topic::Git, "git log --oneline main..feature/rounding"),
    step(Topic::Git, "git blame -L 1,25 rust/src/money.rs"),
    step(
        Topic::Git,
        "git apply --check -v patches/parse-rounding.patch",
    ),
    step(Topic::Rust, "cd rust && cargo build --offline"),
    step(Topic::Rust, "cd rust && cargo build --bin report"),
    step(
        Topic::Rust,
        "cd rust && cargo build --bin import 2>&1 | head -40",
    ),
    step(Topic::Rust, "cd rust && cargo build --bin export"),
    step(Topic::Rust, "cd rust && cargo build --bin migrate"),
    step(Topic::Rust, "cd rust && cargo run --bin audit -- 10"),
    step(Topic::Rust, "cd rust && cargo build --example summary"),
    step(Topic::Rust, "cd rust && cargo test --offline --lib"),
    step(Topic::Rust, "cd rust && cargo test --doc"),
    step(Topic::Rust, "cd rust && cargo test --test ledger"),
    step(Topic::Rust, "cd rust && cargo test --offline"),
    step(
        Topic::Rust,
        "cd rust && cargo build --lib --features strict",
    ),
    step(Topic::Rust, "cd rust && cargo clippy --lib -- -D warnings"),
    step(
        Topic::Rust,
        "cd rust && RUSTDOCFLAGS='-D warnings' cargo doc --no-deps --lib",
    ),
    step(
        Topic::Rust,
        "cd rust && cargo test --lib parse -- --nocapture",
    ),
    step(
        Topic::Rust,
        "cd rust && cargo build --lib && cargo run --bin ledger-cli",
    ),
    step(Topic::Python, "cd python && python3 -m pytest"),
    step(
        Topic::Python,
        "cd python && python3 -m pytest -q tests/test_pricing.py",
    ),
    step(
        Topic::Python,
        "cd python && python3 -m pytest -x -k storage --tb=short",
    ),
    step(Topic::Python, "cd python && python3 -m pytest -q --tb=line"),
    step(
        Topic::Python,
        "cd python && python3 -m inventory.cli data/items.json",
    ),
    step(
        Topic::Python,
        "cd python && python3 -m inventory.cli data/missing.json",
    ),
    step(Topic::Go, "cd go && go test ./..."),
    step(Topic::Go, "cd go && go test -run TestRate -v ./..."),
    step(Topic::Go, "cd go && go test -run TestLabelLines ./..."),
    step(Topic::Go, "cd go && go vet ./..."),
    step(Topic::Go, "cd go && go build ./... && echo build ok"),
    step(Topic::Node, "cd node && npm test"),
    step(Topic::Node, "cd node && npm run build"),
    step(Topic::Node, "cd node && npm run lint"),
    step(Topic::Node, "cd node && npm ci"),
    step(Topic::Node, "cd node && npm install --offline"),
    step(Topic::Node, "cd node && node index.js"),
    step(Topic::Node, "cd node && node --test test/cart.test.js"),
];

/// Commands against the API server (`KUBECONFIG` set), in the order they run.
pub const KUBE: &[Step] = &[
    step(Topic::Kube, "kubectl get pods -n shop"),
    step(Topic::Kube, "kubectl apply -f deploy/namespace.yaml"),
    step(Topic::Kube, "kubectl apply -f deploy/"),
    step(Topic::Kube, "kubectl get all -n shop"),
    step(
        Topic::Kube,
        "kubectl rollout status deployment/web -n shop --timeout=5s",
    ),
    step(Topic::Kube, "kubectl describe deployment web -n shop"),
    step(Topic::Kube, "kubectl get deployment web -n shop -o yaml"),
    step(Topic::Kube, "kubectl get pod web-0 -n shop"),
    step(Topic::Kube, "kubectl logs deployment/api -n shop"),
    step(Topic::Kube, "kubectl delete configmap cart-config -n shop"),
    step(
        Topic::Kube,
        "kubectl get secrets -n shop --as=system:serviceaccount:shop:reader",
    ),
    step(
        Topic::Kube,
        "kubectl delete pods --all -n kube-system --as=system:serviceaccount:shop:reader",
    ),
    step(
        Topic::Kube,
        "kubectl auth can-i list secrets -n shop --as=system:serviceaccount:shop:reader",
    ),
    step(
        Topic::Kube,
        "kubectl create configmap Web_Config -n shop --from-literal=MODE=live",
    ),
    step(Topic::Kube, "kubectl apply -f deploy/cache.yaml"),
    step(Topic::Kube, "kubectl apply -f deploy/api.yaml"),
    step(Topic::Kube, "kubectl apply -f deploy/worker.yaml"),
    step(Topic::Kube, "kubectl get --raw /openapi/v2 | head -c 40000"),
    step(Topic::Kube, "kubectl get all -A -o json | head -c 30000"),
    step(Topic::Kube, "kubectl api-resources"),
    step(Topic::Kube, "kubectl get events -n shop"),
];

/// Edits an agent makes while fixing what the commands showed, recorded as `git diff`.
pub const EDITS: &[Edit] = &[
    Edit {
        path: "rust/src/money.rs",
        old: "            1 | 2 => frac.parse().ok().filter(|f: &i64| *f >= 0)?,",
        new: "            1 => frac.parse::<i64>().ok()? * 10,\n            2 => frac.parse().ok().filter(|f: &i64| *f >= 0)?,",
    },
    Edit {
        path: "rust/src/bin/report.rs",
        old: "let total: i64 = ledger.balance(\"bank\").to_string();",
        new: "let total = ledger.balance(\"bank\");",
    },
    Edit {
        path: "rust/src/bin/import.rs",
        old: "println!(\"imported {} entries\", entries_count);",
        new: "println!(\"imported {} entries\", ledger.entries().len());",
    },
    Edit {
        path: "rust/src/lib.rs",
        old: "self.entries.len() == 0",
        new: "self.entries.is_empty()",
    },
    Edit {
        path: "rust/src/lib.rs",
        old: "[`Ledgr::post`]",
        new: "[`Ledger::post`]",
    },
    Edit {
        path: "python/inventory/pricing.py",
        old: "    return item.price_cents * (100 - percent) // 100",
        new: "    return (item.price_cents * (100 - percent) + 50) // 100",
    },
    Edit {
        path: "python/inventory/pricing.py",
        old: "    return [i.sku for i in items if i.stock < threshold]",
        new: "    return sorted(i.sku for i in items if i.stock < threshold)",
    },
    Edit {
        path: "python/data/items.json",
        old: "\"price\": 1299",
        new: "\"price_cents\": 1299",
    },
    Edit {
        path: "go/rates.go",
        old: "if grams < r.MaxGrams {",
        new: "if grams <= r.MaxGrams {",
    },
    Edit {
        path: "go/label.go",
        old: "\tparts := strings.Split(l.City, \",\")\n\treturn []string{l.Name, l.Street, strings.TrimSpace(parts[1]), l.Country}",
        new: "\tcity := l.City\n\tif i := strings.LastIndex(city, \",\"); i >= 0 {\n\t\tcity = city[i+1:]\n\t}\n\treturn []string{l.Name, l.Street, strings.TrimSpace(city), l.Country}",
    },
    Edit {
        path: "node/lib/tax.js",
        old: "return Math.floor((netCents * rate) / 100);",
        new: "return Math.round((netCents * (rate ?? 0)) / 100);",
    },
    Edit {
        path: "node/package.json",
        old: "\"build\": \"node scripts/build.js\",",
        new: "\"build\": \"node scripts/build.js\",\n    \"lint\": \"node --check index.js\",",
    },
    Edit {
        path: "deploy/web.yaml",
        old: "      nodeSelector:\n        shop.example.com/pool: checkout\n",
        new: "",
    },
    Edit {
        path: "deploy/api.yaml",
        old: "  replica: 3",
        new: "  replicas: 3",
    },
];

/// Commands after the edits, in the order they run.
pub const AFTER_EDITS: &[Step] = &[
    step(Topic::Git, "git status --short"),
    step(Topic::Git, "git diff --stat"),
    step(
        Topic::Git,
        "git status --short && git checkout feature/rounding",
    ),
    step(
        Topic::Git,
        "git log --oneline -3 && git rebase feature/rounding",
    ),
    step(
        Topic::Git,
        "git stash -q && git cherry-pick feature/rounding",
    ),
    step(
        Topic::Git,
        "git cherry-pick --abort && git stash pop -q && git status --short",
    ),
    step(Topic::Rust, "cd rust && cargo test --offline --lib"),
    step(Topic::Python, "cd python && python3 -m pytest -q"),
    step(Topic::Go, "cd go && go test ./..."),
    step(Topic::Node, "cd node && npm test"),
];

/// The tools the recorder needs and how each prints its version.
pub const TOOLS: &[(&str, &str)] = &[
    ("cargo", "cargo --version"),
    ("rustc", "rustc --version"),
    ("clippy", "cargo clippy --version"),
    ("go", "go version"),
    ("python3", "python3 --version"),
    ("pytest", "python3 -m pytest --version"),
    ("node", "node --version"),
    ("npm", "npm --version"),
    ("git", "git --version"),
    ("grep", "grep --version | head -1"),
];

/// Everything above as text, for the cache key.
pub fn fingerprint() -> String {
    format!("{REPOSITORY:?}{LOCAL:?}{KUBE:?}{EDITS:?}{AFTER_EDITS:?}{TOOLS:?}")
}
