//! The binary's allocator: glibc's, re-executed once with insitu's
//! tunables, for every command; mimalloc keeping freed memory when
//! `INSITU_ALLOCATOR=mimalloc`; the process logs which at debug level
//! when it starts.

#![cfg(all(target_os = "linux", target_env = "gnu"))]

use std::process::Command;

use crate::common;

/// Runs `insitu args` with a clean allocator setup plus `env`, and returns
/// whether it succeeded and its stderr (which holds the allocator line).
fn run(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_insitu"));
    command.args(args).env("INSITU_LOG", "insitu=debug");
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        let allocator = ["MALLOC_", "MIMALLOC_", "INSITU_ALLOCATOR"];
        if allocator.iter().any(|p| k.starts_with(p)) || k == "GLIBC_TUNABLES" {
            command.env_remove(&*k);
        }
    }
    let out = command
        .envs(env.iter().copied())
        .output()
        .expect("run insitu");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.success(), stderr)
}

/// The allocator line of a run's stderr.
fn allocator_line(stderr: &str) -> &str {
    stderr
        .lines()
        .find(|l| l.contains("allocator: "))
        .unwrap_or_else(|| panic!("no allocator line in {stderr}"))
}

fn sql_select_one(env: &[(&str, &str)]) -> (bool, String) {
    let root = common::tpch_root(0.01, 4);
    let root = root.to_str().expect("utf-8");
    run(&["sql", "--root", root, "--format", "csv", "select 1"], env)
}

#[test]
fn queries_run_on_tuned_glibc() {
    let (ok, stderr) = sql_select_one(&[]);
    assert!(ok, "{stderr}");
    let line = allocator_line(&stderr);
    assert!(line.contains("system (glibc)"), "{line}");
    assert!(
        line.contains("GLIBC_TUNABLES=glibc.malloc.hugetlb=1"),
        "{line}"
    );
}

#[test]
fn mimalloc_when_asked_keeps_freed_memory() {
    let (ok, stderr) = sql_select_one(&[("INSITU_ALLOCATOR", "mimalloc")]);
    assert!(ok, "{stderr}");
    let line = allocator_line(&stderr);
    assert!(
        line.contains("mimalloc, purge_delay -1 ms; freed memory kept"),
        "{line}"
    );
}

/// The option number insitu sets is the one `MIMALLOC_PURGE_DELAY` sets,
/// and a delay the user set stays.
#[test]
fn a_purge_delay_the_user_set_is_kept() {
    let env = [
        ("INSITU_ALLOCATOR", "mimalloc"),
        ("MIMALLOC_PURGE_DELAY", "4321"),
    ];
    let (ok, stderr) = sql_select_one(&env);
    assert!(ok, "{stderr}");
    let line = allocator_line(&stderr);
    assert!(
        line.contains("mimalloc, purge_delay 4321 ms; purge delay set by the user"),
        "{line}"
    );
}

#[test]
fn extsort_runs_on_glibc_with_insitu_tunables() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing").to_string_lossy().into_owned();
    let out = dir.path().join("out").to_string_lossy().into_owned();
    // The allocator is set up before the arguments are even read.
    let (ok, stderr) = run(&["extsort", &missing, &out], &[]);
    assert!(!ok, "{stderr}");
    let line = allocator_line(&stderr);
    assert!(line.contains("system (glibc)"), "{line}");
    assert!(!line.contains("INSITU_ALLOCATOR="), "{line}");
    for want in ["hugetlb=1", "arena_max=1", "mmap_threshold=33554432"] {
        assert!(
            line.contains(&format!("glibc.malloc.{want}")),
            "{want}: {line}"
        );
    }
}

#[test]
fn a_glibc_the_user_tuned_is_left_as_it_is() {
    for (k, v) in [
        ("GLIBC_TUNABLES", "glibc.malloc.arena_max=4"),
        ("MALLOC_ARENA_MAX", "4"),
    ] {
        let (_, stderr) = run(
            &["extsort", "/nonexistent/in", "/nonexistent/out"],
            &[(k, v)],
        );
        let line = allocator_line(&stderr);
        assert!(
            line.contains("system (glibc); tuned by the user"),
            "{k}: {line}"
        );
    }
    // Already on glibc and tuned by the user: nothing to re-execute for.
    let env = [("INSITU_ALLOCATOR", "system"), ("MALLOC_ARENA_MAX", "4")];
    let (ok, stderr) = sql_select_one(&env);
    assert!(ok, "{stderr}");
    let line = allocator_line(&stderr);
    assert!(line.contains("system (glibc); tuned by the user"), "{line}");
}

#[test]
fn the_allocator_variable_chooses_and_is_checked() {
    let (ok, stderr) = sql_select_one(&[("INSITU_ALLOCATOR", "system")]);
    assert!(ok, "{stderr}");
    let line = allocator_line(&stderr);
    assert!(line.contains("system (glibc)"), "{line}");
    assert!(
        line.contains("GLIBC_TUNABLES=glibc.malloc.hugetlb=1"),
        "{line}"
    );
    // Re-executed for the tunables only: the user's variable stays theirs.
    assert!(!line.contains("INSITU_ALLOCATOR="), "{line}");
    let (ok, stderr) = sql_select_one(&[("INSITU_ALLOCATOR", "jemalloc")]);
    assert!(!ok);
    assert!(
        stderr.contains("INSITU_ALLOCATOR must be mimalloc or system, not \"jemalloc\""),
        "{stderr}"
    );
}
