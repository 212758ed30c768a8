//! The engine's tests: one binary, a module per topic. Everything here runs without a
//! network, a store server or the simulator.

mod classify;
mod converge;
mod deps;
mod ladder;
mod pairing_alloc;
mod probe;
mod props;
mod recovery;
mod sight;
mod turn;
mod why;

/// A current-thread runtime for the tests that drive the async passes.
pub fn rt() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_current_thread().build() {
        Ok(rt) => rt,
        Err(e) => panic!("runtime: {e}"),
    }
}
