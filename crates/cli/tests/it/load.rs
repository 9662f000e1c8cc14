//! `insitu load`: user files in, queryable across devices; bad files out
//! with nothing left behind.

use crate::common;

use std::path::Path;

fn write_csv(path: &Path, rows: std::ops::Range<i64>) {
    let mut text = String::from("id,name,score\n");
    for i in rows {
        let name = if i % 7 == 0 {
            String::new()
        } else {
            format!("n{}", i % 13)
        };
        text.push_str(&format!("{i},{name},{}.5\n", i % 100));
    }
    std::fs::write(path, text).expect("csv");
}

/// Runs `insitu load --table TABLE --devices N --root ROOT ARGS...`.
fn load(table: &str, devices: u32, root: &str, args: &[&str]) -> (bool, String, String) {
    let devices = devices.to_string();
    let mut all = vec![
        "load",
        "--table",
        table,
        "--devices",
        &devices,
        "--root",
        root,
    ];
    all.extend_from_slice(args);
    common::insitu(&all)
}

#[test]
fn loads_csv_files_across_devices_and_answers_like_a_reference() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, b) = (dir.path().join("a.csv"), dir.path().join("b.csv"));
    write_csv(&a, 0..30_000);
    write_csv(&b, 30_000..50_001);
    let root = dir.path().join("root");
    let root_s = root.to_str().expect("utf-8");
    let (ok, _, err) = load(
        "scores",
        3,
        root_s,
        &[a.to_str().expect("utf-8"), b.to_str().expect("utf-8")],
    );
    assert!(ok, "{err}");
    assert!(err.contains("loaded 50001 rows"), "{err}");
    for dev in 0..3 {
        assert!(root.join(format!("dev{dev}/scores/00000.parquet")).exists());
    }
    let n: i64 = 50_001;
    let expected_sum: i64 = (0..n).sum();
    let sql = "select count(*) as n, sum(id) as s, count(distinct name) as names, min(score) as lo from scores where id >= 0";
    for pushdown in ["on", "off"] {
        let (ok, out, err) = common::insitu(&[
            "sql",
            sql,
            "--root",
            root_s,
            "--pushdown",
            pushdown,
            "--format",
            "csv",
        ]);
        assert!(ok, "{err}");
        // 13 distinct names minus the empty string read as NULL.
        assert_eq!(
            out,
            format!("n,s,names,lo\n{n},{expected_sum},13,0.5\n"),
            "pushdown {pushdown}"
        );
    }
    // Loading again is refused unless --replace.
    let (ok, _, err) = load("scores", 3, root_s, &[a.to_str().expect("utf-8")]);
    assert!(!ok);
    assert!(
        err.contains("table scores already exists") && err.contains("--replace"),
        "{err}"
    );
    let (ok, _, err) = load(
        "scores",
        3,
        root_s,
        &["--replace", a.to_str().expect("utf-8")],
    );
    assert!(ok, "{err}");
    let (_, out, _) = common::insitu(&[
        "sql",
        "select count(*) as n from scores",
        "--root",
        root_s,
        "--format",
        "csv",
    ]);
    assert_eq!(out, "n\n30000\n");
}

#[test]
fn a_bad_file_leaves_no_table_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = dir.path().join("good.csv");
    write_csv(&good, 0..10_000);
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "other,columns\n1,2\n").expect("csv");
    let root = dir.path().join("root");
    let root_s = root.to_str().expect("utf-8");
    let (ok, _, err) = load(
        "t",
        2,
        root_s,
        &[good.to_str().expect("utf-8"), bad.to_str().expect("utf-8")],
    );
    assert!(!ok);
    assert!(
        err.contains("bad.csv") && err.contains("schema differs"),
        "{err}"
    );
    let (ok, _, err) = common::insitu(&["sql", "select * from t", "--root", root_s]);
    assert!(!ok);
    assert!(err.contains("not found"), "{err}");
    for dev in 0..2 {
        let table_dir = root.join(format!("dev{dev}/t"));
        let leftovers: Vec<_> = std::fs::read_dir(&table_dir)
            .map(|d| d.map(|e| e.expect("entry").file_name()).collect())
            .unwrap_or_default();
        assert!(leftovers.is_empty(), "dev{dev} keeps {leftovers:?}");
    }
    let (ok, _, err) = load("u", 2, root_s, &["/no/such/file.parquet"]);
    assert!(!ok);
    assert!(err.contains("/no/such/file.parquet"), "{err}");
}
