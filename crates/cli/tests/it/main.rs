//! The `insitu` binary's integration tests, all in one test binary: every
//! test binary compiles and links the whole engine, so one binary builds
//! it once instead of once per test file.
//!
//! The slow tier (`tpch_sf01`, `load_test`) is `#[ignore]`d and runs with
//! `cargo test --release -p insitu --test it -- --ignored`.

mod common;

mod allocator;
mod cluster;
mod errors;
mod extsort;
mod faults;
mod layout;
mod load;
mod load_test;
mod memory;
mod partitioning;
mod pushdown;
mod sort;
mod tpch_sf001;
mod tpch_sf01;
