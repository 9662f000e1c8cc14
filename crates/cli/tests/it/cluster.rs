//! The spine's correctness suite against device server processes: TPC-H
//! SF 0.01 generated over Arrow Flight onto 3 servers started by
//! `insitu cluster up`, all 22 queries with pushdown on, off and auto checked
//! against DuckDB's answers. Also: capabilities steer what the host pushes.

use crate::common;

use crate::common::{check_all, insitu, TestCluster};
use insitu_host::Pushdown;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_sf001_on_three_device_servers() {
    let cluster = TestCluster::up(3, &[]);
    cluster.gen_tpch("0.01");
    for pushdown in [Pushdown::On, Pushdown::Off, Pushdown::Auto] {
        let host = cluster.host(pushdown).await;
        assert_eq!(host.tables().len(), 8);
        let failures = check_all(&host, "tpch-sf0.01").await;
        assert!(
            failures.is_empty(),
            "3 device servers, {pushdown:?}:\n{}",
            failures.join("\n")
        );
    }
    // The devices counted the work, and the CLI reads the same cluster.
    let (ok, out, err) = insitu(&[
        "sql",
        "--cluster",
        cluster.file_arg(),
        "--format",
        "csv",
        "select count(*) as n from lineitem where l_quantity < 10",
    ]);
    assert!(ok, "{err}");
    let embedded = common::host(&common::tpch_root(0.01, 3), Pushdown::On).await;
    let expected = embedded
        .sql("select count(*) as n from lineitem where l_quantity < 10")
        .await
        .unwrap();
    let n = arrow::util::display::array_value_to_string(expected.batches[0].column(0), 0).unwrap();
    assert_eq!(out.trim(), format!("n\n{n}"), "{out}");
    let (ok, out, err) = insitu(&["cluster", "status", "--cluster", cluster.file_arg()]);
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 2 + 3, "{out}");
}

/// A device that advertises only scan and projection gets only those: the
/// host filters and aggregates itself, and the answer is the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_pushes_only_what_devices_advertise() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("t.csv");
    let mut text = String::from("k,v\n");
    for i in 0..1000 {
        text.push_str(&format!("{},{}\n", i % 10, i));
    }
    std::fs::write(&csv, text).unwrap();
    let sql = "select k, count(*) as n, sum(v) as s from t where v >= 500 group by k order by k";
    let mut answers = vec![];
    let mut device_rows_out = vec![];
    for ops in [None, Some("scan,projection")] {
        let extra: Vec<&str> = ops.map(|o| vec!["--operators", o]).unwrap_or_default();
        let cluster = TestCluster::up(2, &extra);
        cluster.load("t", &csv);
        let host = cluster.host(Pushdown::On).await;
        let caps = host.clients()[0].capabilities().clone();
        assert_eq!(
            caps.operators.len(),
            if ops.is_some() {
                2
            } else {
                insitu_wire::Operator::ALL.len()
            }
        );
        let plan = host.sql(&format!("explain {sql}")).await.unwrap();
        let text = arrow::util::pretty::pretty_format_batches(&plan.batches)
            .unwrap()
            .to_string();
        let stage_line = text
            .lines()
            .find(|l| l.contains("DeviceScanExec"))
            .expect("device scan")
            .to_string();
        let outcome = host.sql(sql).await.unwrap();
        answers.push(
            arrow::util::pretty::pretty_format_batches(&outcome.batches)
                .unwrap()
                .to_string(),
        );
        let mut rows_out = 0;
        for c in host.clients() {
            rows_out += c.stats().await.unwrap().rows_out;
        }
        device_rows_out.push(rows_out);
        if ops.is_some() {
            assert!(!stage_line.contains("Filter"), "{stage_line}");
            assert!(!stage_line.contains("Aggregate"), "{stage_line}");
        } else {
            assert!(stage_line.contains("Aggregate"), "{stage_line}");
        }
    }
    assert_eq!(answers[0], answers[1]);
    assert!(answers[0].contains("| 9 | 50 | 37700 |"), "{}", answers[0]);
    // Full pushdown sends one partial row per group and device; the limited
    // devices send every row of the scan.
    assert!(device_rows_out[0] <= 20, "{device_rows_out:?}");
    assert_eq!(device_rows_out[1], 1000, "{device_rows_out:?}");
}

/// Runs `openssl` with `args` in `dir`; panics with its stderr on failure.
fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A device server with TLS and a token: a host with the CA certificate
/// loads and queries over https; a plain-text client gets nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_device_server() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509", "-days", "2", "-subj", "/CN=insitu test CA"];
    ca.extend(ec);
    ca.extend(["-keyout", "ca.key", "-out", "ca.pem"]);
    ca.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
    ca.extend(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
    openssl(d, &ca);
    let mut csr = vec![
        "req",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ];
    csr.extend(ec);
    openssl(d, &csr);
    std::fs::write(
        d.join("ext.cnf"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        d,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            "server.pem",
            "-extfile",
            "ext.cnf",
        ],
    );
    std::fs::write(d.join("token"), "tls-test-token").unwrap();
    let ready = d.join("ready");
    let mut server = std::process::Command::new(env!("CARGO_BIN_EXE_insitu"))
        .args([
            "device",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--threads",
            "1",
            "--dir",
        ])
        .arg(d.join("dev0"))
        .arg("--tls-cert")
        .arg(d.join("server.pem"))
        .arg("--tls-key")
        .arg(d.join("server.key"))
        .arg("--token-file")
        .arg(d.join("token"))
        .arg("--ready-file")
        .arg(&ready)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let addr = loop {
        if let Ok(a) = std::fs::read_to_string(&ready) {
            break a;
        }
        assert!(started.elapsed().as_secs() < 20, "server did not start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let cluster = d.join("cluster.toml");
    std::fs::write(
        &cluster,
        format!(
            "[[device]]\nid = 0\nendpoint = \"https://{addr}\"\ntoken_file = \"token\"\ntls_ca = \"ca.pem\"\n"
        ),
    )
    .unwrap();
    let csv = d.join("t.csv");
    std::fs::write(&csv, "a,b\n1,x\n2,y\n3,z\n").unwrap();
    let cluster_arg = cluster.to_str().unwrap();
    let (ok, _, err) = insitu(&[
        "load",
        "--table",
        "t",
        "--cluster",
        cluster_arg,
        csv.to_str().unwrap(),
    ]);
    let (ok2, out, err2) = insitu(&[
        "sql",
        "--cluster",
        cluster_arg,
        "--format",
        "csv",
        "select sum(a) as s from t where b <> 'y'",
    ]);
    // Plain text against the TLS port fails to connect.
    std::fs::write(
        &cluster,
        format!("[[device]]\nid = 0\nendpoint = \"http://{addr}\"\ntoken_file = \"token\"\n"),
    )
    .unwrap();
    let plain = insitu_flight::connect_cluster(&cluster, None, Default::default()).await;
    let _ = server.kill();
    let _ = server.wait();
    assert!(ok, "load over TLS: {err}");
    assert!(ok2, "sql over TLS: {err2}");
    assert_eq!(out.trim(), "s\n4");
    let e = plain.unwrap_err().to_string();
    assert!(e.contains("device 0 at http://"), "{e}");
}

/// Prometheus metrics on `--metrics`, and one query id in the host's and
/// the device's logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_query_ids_in_logs() {
    use std::io::{Read, Write};
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let root = tempfile::tempdir().unwrap();
    let root_arg = root.path().to_str().unwrap();
    let port_arg = port.to_string();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_insitu"))
            .args(args)
            .env("INSITU_LOG", "info")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{args:?}: {err}");
        err
    };
    run(&[
        "cluster",
        "up",
        "--devices",
        "1",
        "--root",
        root_arg,
        "--threads",
        "1",
        "--metrics-base-port",
        &port_arg,
    ]);
    let cluster = root.path().join("cluster.toml");
    let _down = Down(cluster.clone());
    let csv = root.path().join("t.csv");
    std::fs::write(&csv, "a\n1\n2\n3\n").unwrap();
    let cluster_arg = cluster.to_str().unwrap();
    run(&[
        "load",
        "--table",
        "t",
        "--cluster",
        cluster_arg,
        csv.to_str().unwrap(),
    ]);
    let host_log = run(&[
        "sql",
        "--cluster",
        cluster_arg,
        "--pushdown",
        "on",
        "select sum(a) from t where a > 1",
    ]);
    let query_id = host_log
        .lines()
        .find(|l| l.contains("query started"))
        .and_then(|l| l.split("query=").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no query id in host log:\n{host_log}"))
        .to_string();
    let device_log = std::fs::read_to_string(root.path().join("dev0.log")).unwrap();
    assert!(
        device_log
            .lines()
            .any(|l| l.contains("stage finished") && l.contains(&format!("query={query_id}"))),
        "query {query_id} not in device log:\n{device_log}"
    );
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    conn.read_to_string(&mut body).unwrap();
    assert!(
        body.starts_with("HTTP/1.0 200") || body.starts_with("HTTP/1.1 200"),
        "{body}"
    );
    assert!(body.contains("text/plain; version=0.0.4"), "{body}");
    for line in [
        "insitu_device_stages_ok_total{device=\"0\"} 1",
        "insitu_device_rows_out_total{device=\"0\"} 1",
        "insitu_device_active_streams{device=\"0\"} 0",
        "insitu_device_memory_limit_bytes{device=\"0\"} 4294967296",
        "insitu_device_partitions_ingested_total{device=\"0\"} 1",
    ] {
        assert!(body.lines().any(|l| l == line), "missing {line}:\n{body}");
    }
    assert!(
        body.contains(
            "insitu_device_operator_seconds_total{device=\"0\",operator=\"AggregateExec\"}"
        ),
        "{body}"
    );
    let resident = body
        .lines()
        .find_map(|l| l.strip_prefix("insitu_device_resident_peak_bytes{device=\"0\"} "))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no resident peak:\n{body}"));
    assert!(resident > 1 << 20, "the server's resident peak: {resident}");
}

/// Stops a cluster on drop.
struct Down(std::path::PathBuf);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = insitu(&["cluster", "down", "--cluster", self.0.to_str().unwrap()]);
    }
}
