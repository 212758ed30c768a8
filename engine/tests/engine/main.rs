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
