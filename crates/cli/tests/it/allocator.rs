//! The binary re-executes itself once with glibc's allocator tuned
//! (huge pages for the heap among others), unless the user tuned it.

#![cfg(all(target_os = "linux", target_env = "gnu"))]

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use crate::common;

/// The environment the `insitu sql` process was last executed with (what
/// `/proc/PID/environ` shows), read once it has answered a query, so any
/// re-execution is behind it. `env` is added to a clean allocator setup.
fn exec_environment(env: &[(&str, &str)]) -> Vec<String> {
    let root = common::tpch_root(0.01, 4);
    let mut command = Command::new(env!("CARGO_BIN_EXE_insitu"));
    command
        .args(["sql", "--root", root.to_str().expect("utf-8")])
        .args(["--format", "csv"])
        .env_remove("GLIBC_TUNABLES")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("MALLOC_") {
            command.env_remove(k);
        }
    }
    let mut child = command.spawn().expect("spawn");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(b"select 41 + 1 as n;\n").expect("write");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let answer: Vec<String> = lines.by_ref().take(2).map(|l| l.expect("line")).collect();
    assert_eq!(answer, ["n", "42"]);
    let environ = std::fs::read(format!("/proc/{}/environ", child.id())).expect("environ");
    drop(stdin);
    assert!(child.wait().expect("wait").success());
    environ
        .split(|&b| b == 0)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect()
}

#[test]
fn the_binary_runs_under_its_allocator_tunables() {
    let env = exec_environment(&[]);
    assert!(
        env.iter().any(|v| v == "INSITU_ALLOCATOR_TUNED=1"),
        "{env:?}"
    );
    // glibc may parse GLIBC_TUNABLES in place, leaving NULs between the
    // tunables: look for each among all entries joined as one list.
    let all = env.join(":").replace("GLIBC_TUNABLES=", "");
    for want in ["hugetlb=1", "arena_max=1", "mmap_threshold=33554432"] {
        let want = format!(":glibc.malloc.{want}:");
        assert!(
            format!(":{all}:").contains(&want),
            "{want} missing: {env:?}"
        );
    }
}

#[test]
fn an_allocator_the_user_tuned_is_left_as_it_is() {
    for (k, v) in [
        ("GLIBC_TUNABLES", "glibc.malloc.arena_max=4"),
        ("MALLOC_ARENA_MAX", "4"),
    ] {
        let env = exec_environment(&[(k, v)]);
        assert!(env.contains(&format!("{k}={v}")), "{env:?}");
        assert!(
            !env.iter().any(|v| v.contains("INSITU_ALLOCATOR_TUNED")),
            "{k}: re-executed anyway: {env:?}"
        );
    }
}
