//! The corpus of real tool output ([`cairn_corpus`]): read from its cache, or recorded once
//! per process (kubectl against a real API server this harness starts) and cached.

use std::sync::OnceLock;

use cairn_corpus::Corpus;
use cairn_corpus::record::{Cluster, cache_dir, load_or_record};

use super::controlplane::{Binaries, ControlPlane};
use super::run_dir;

/// The corpus of this machine's tools.
///
/// # Panics
/// When the control plane's binaries are missing or the recording fails: every test that
/// asks for the corpus needs it.
pub fn corpus() -> &'static Corpus {
    static CORPUS: OnceLock<Corpus> = OnceLock::new();
    CORPUS.get_or_init(|| {
        let binaries = Binaries::ensure().unwrap_or_else(|e| {
            panic!(
                "the corpus records kubectl against a real API server, whose binaries are \
                 missing (bash tests/harness/build-control-plane.sh builds them): {e}"
            )
        });
        let start = || {
            let dir = run_dir("corpus").map_err(|e| e.to_string())?;
            let cp = ControlPlane::start(&dir).map_err(|e| e.to_string())?;
            Ok(Cluster {
                kubeconfig: cp.kubeconfig.clone(),
                guard: Box::new(cp),
            })
        };
        load_or_record(&cache_dir(), &binaries.kubectl, start)
            .unwrap_or_else(|e| panic!("recording the corpus: {e}"))
    })
}
