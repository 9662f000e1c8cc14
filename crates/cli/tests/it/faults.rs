//! Faults of device servers, each checked for behaviour and message: a
//! device killed mid-query, a device down at start, wrong or missing
//! tokens, an upload cut off half-way, garbage and oversized plans, and a
//! port already in use.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{insitu, TestCluster};
use arrow::array::{ArrayRef, Int64Array};
use arrow::record_batch::RecordBatch;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{Action, FlightData, FlightDescriptor, HandshakeRequest, Ticket};
use bytes::Bytes;
use futures::StreamExt;
use insitu_host::{HostConfig, InsituHost, Pushdown};
use insitu_link::LinkProfile;
use tonic::transport::Channel;
use tonic::{Code, Request};

async fn raw_client(addr: &str) -> FlightServiceClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    FlightServiceClient::new(channel)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20)
}

fn authorized<T>(message: T, token: &str) -> Request<T> {
    let mut r = Request::new(message);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

fn list_tables() -> Action {
    Action {
        r#type: "list_tables".into(),
        body: Bytes::new(),
    }
}

/// A 1-device cluster holding table `t`: one Int64 column, 0..rows.
fn cluster_with_table(rows: usize) -> TestCluster {
    let cluster = TestCluster::up(1, &[]);
    let csv = cluster.root.path().join("t.csv");
    let mut text = String::from("x\n");
    for i in 0..rows {
        text.push_str(&format!("{i}\n"));
    }
    std::fs::write(&csv, text).unwrap();
    cluster.load("t", &csv);
    cluster
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_or_missing_token_is_rejected() {
    let cluster = TestCluster::up(1, &[]);
    let mut client = raw_client(&cluster.addr(0)).await;
    let missing = client
        .do_action(Request::new(list_tables()))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::Unauthenticated);
    assert_eq!(missing.message(), "device 0: missing bearer token");
    let wrong = client
        .do_action(authorized(list_tables(), "not-the-token"))
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), Code::Unauthenticated);
    assert_eq!(wrong.message(), "device 0: wrong bearer token");
    let get = client
        .do_get(Request::new(Ticket {
            ticket: Bytes::from_static(b"x"),
        }))
        .await
        .unwrap_err();
    assert_eq!(get.code(), Code::Unauthenticated);
    let hello = HandshakeRequest {
        protocol_version: u64::from(insitu_wire::PROTOCOL_VERSION),
        payload: Bytes::from_static(b"guess"),
    };
    let shake = client
        .handshake(Request::new(futures::stream::once(async move { hello })))
        .await
        .unwrap_err();
    assert_eq!(shake.code(), Code::Unauthenticated);
    // The right token works, by header or by handshake.
    let token = cluster.token();
    client
        .do_action(authorized(list_tables(), &token))
        .await
        .expect("authorized call");
    let hello = HandshakeRequest {
        protocol_version: u64::from(insitu_wire::PROTOCOL_VERSION),
        payload: Bytes::from(token.clone()),
    };
    client
        .handshake(Request::new(futures::stream::once(async move { hello })))
        .await
        .expect("handshake with the token");
    // Through a cluster file with the wrong token, the host names the device.
    std::fs::write(cluster.root.path().join("cluster.token"), "wrong").unwrap();
    let err = insitu_flight::connect_cluster(&cluster.file, None, Default::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("device 0 at http://"), "{err}");
    assert!(err.contains("wrong token"), "{err}");
    std::fs::write(cluster.root.path().join("cluster.token"), token).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_down_at_start_is_reported_by_name() {
    let cluster = TestCluster::up(2, &[]);
    // Stop device 1, keep device 0.
    let pid = cluster.pid(1);
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let started = Instant::now();
    while std::fs::metadata(format!("/proc/{pid}")).is_ok()
        && started.elapsed() < Duration::from_secs(10)
    {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat.contains(") Z") {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let err = insitu_flight::connect_cluster(&cluster.file, None, Default::default())
        .await
        .unwrap_err()
        .to_string();
    let addr = cluster.addr(1);
    assert!(err.contains("cannot reach 1 of 2 devices"), "{err}");
    assert!(
        err.contains(&format!("device 1 at http://{addr}: unreachable")),
        "{err}"
    );
    assert!(!err.contains("device 0 at"), "{err}");
    let (ok, _, stderr) = insitu(&["sql", "--cluster", cluster.file_arg(), "select 1"]);
    assert!(!ok);
    assert!(
        stderr.contains(&format!("device 1 at http://{addr}")),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_device_mid_query_is_named_within_two_seconds_and_host_recovers() {
    let cluster = TestCluster::up(3, &[]);
    cluster.gen_tpch("0.1");
    let config = HostConfig {
        pushdown: Pushdown::On,
        target_partitions: 2,
        ..Default::default()
    };
    let host = InsituHost::new(cluster.clients().await, config)
        .await
        .unwrap();
    // Far more result bytes per device (about 7 MiB each) than the device's
    // result channel and the HTTP/2 windows hold: the host reads one batch,
    // pauses, and every device waits on backpressure mid-stream.
    let sql = "select l_orderkey, l_partkey, l_suppkey, l_quantity, l_extendedprice, \
               l_discount, l_tax, l_comment, l_shipinstruct, l_shipmode from lineitem";
    let df = host.context().sql(sql).await.unwrap();
    let mut stream = df.execute_stream().await.unwrap();
    stream.next().await.expect("a first batch").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = cluster.pid(1);
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let killed = Instant::now();
    let mut rows_after_kill = 0;
    let err = loop {
        match stream.next().await {
            Some(Ok(b)) => rows_after_kill += b.num_rows(),
            Some(Err(e)) => break e.to_string(),
            None => panic!("the query finished despite the kill ({rows_after_kill} rows)"),
        }
    };
    let took = killed.elapsed();
    drop(stream);
    assert!(took < Duration::from_secs(2), "error after {took:?}: {err}");
    assert!(
        err.contains(&format!("device 1 at http://{}", cluster.addr(1))),
        "{err}"
    );

    // Restart device 1 on its address; the same host answers again.
    let dir = cluster.root.path().join("dev1");
    let token = cluster.root.path().join("cluster.token");
    let mut server = std::process::Command::new(env!("CARGO_BIN_EXE_insitu"))
        .args(["device", "serve", "--threads", "1", "--dir"])
        .arg(&dir)
        .args(["--listen", &cluster.addr(1), "--token-file"])
        .arg(&token)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut answer = None;
    for _ in 0..100 {
        match host.sql("select count(*) from orders").await {
            Ok(o) => {
                answer = Some(o);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    let answer = answer.expect("host usable after the device came back");
    let n = arrow::util::display::array_value_to_string(answer.batches[0].column(0), 0).unwrap();
    assert_eq!(n, "150000");
}

/// Uploads of table `t` partition 0 that break off must not change it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_upload_leaves_the_table_unchanged() {
    let cluster = cluster_with_table(50_000);
    let token = cluster.token();
    let mut client = raw_client(&cluster.addr(0)).await;
    let manifest = |bytes: &[u8]| insitu_wire::Manifest::from_json(bytes, "m").unwrap();
    let read_manifest = |mut client: FlightServiceClient<Channel>, token: String| async move {
        let mut s = client
            .do_action(authorized(list_tables(), &token))
            .await
            .unwrap()
            .into_inner();
        let mut out = vec![];
        while let Some(r) = s.message().await.unwrap() {
            out.extend_from_slice(&r.body);
        }
        out
    };
    let before = manifest(&read_manifest(client.clone(), token.clone()).await);
    let batch = RecordBatch::try_from_iter([(
        "x",
        Arc::new(Int64Array::from_iter_values(0..10_000)) as ArrayRef,
    )])
    .unwrap();
    let put = serde_json::json!({"table": "t", "partition": 0, "row_group_rows_max": 1000});
    let encoded: Vec<FlightData> = arrow_flight::encode::FlightDataEncoderBuilder::new()
        .with_flight_descriptor(Some(FlightDescriptor::new_cmd(put.to_string())))
        .build(futures::stream::iter(vec![Ok(batch.clone()), Ok(batch)]))
        .map(|m| m.unwrap())
        .collect()
        .await;
    assert!(encoded.len() >= 3);

    // 1. The stream ends half-way, without its commit message.
    let half: Vec<FlightData> = encoded[..2].to_vec();
    let err = client
        .do_put(authorized(futures::stream::iter(half), &token))
        .await
        .map(|r| r.into_inner());
    let err = match err {
        Err(e) => e,
        Ok(mut s) => s.message().await.unwrap_err(),
    };
    assert_eq!(err.code(), Code::DataLoss, "{err:?}");
    assert!(
        err.message()
            .contains("device 0: upload of table t partition 0 rejected"),
        "{}",
        err.message()
    );
    assert!(
        err.message().contains("without its commit"),
        "{}",
        err.message()
    );

    // 2. A commit whose checksum does not match what arrived.
    let mut forged = encoded.clone();
    forged.push(FlightData {
        app_metadata: Bytes::from(r#"{"rows":20000,"messages":3,"crc32":1}"#),
        ..Default::default()
    });
    let err = match client
        .do_put(authorized(futures::stream::iter(forged), &token))
        .await
    {
        Err(e) => e,
        Ok(r) => r.into_inner().message().await.unwrap_err(),
    };
    assert_eq!(err.code(), Code::DataLoss);
    assert!(err.message().contains("crc32"), "{}", err.message());

    // 3. The connection drops in the middle of the upload.
    let (tx, rx) = tokio::sync::mpsc::channel::<FlightData>(1);
    let mut dropping = raw_client(&cluster.addr(0)).await;
    let stream =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let call = tokio::spawn({
        let token = token.clone();
        async move {
            dropping
                .do_put(authorized(stream, &token))
                .await
                .map(|_| ())
        }
    });
    tx.send(encoded[0].clone()).await.unwrap();
    tx.send(encoded[1].clone()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    call.abort();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let after = manifest(&read_manifest(client.clone(), token.clone()).await);
    assert_eq!(before, after, "the manifest changed");
    let table_dir = cluster.root.path().join("dev0").join("t");
    let names: Vec<String> = std::fs::read_dir(&table_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["00000.parquet".to_string()], "{names:?}");
    let (ok, out, err) = insitu(&[
        "sql",
        "--cluster",
        cluster.file_arg(),
        "--format",
        "csv",
        "select count(*) as n, sum(x) as s from t",
    ]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "n,s\n50000,1249975000");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_oversized_plans_are_errors_not_crashes() {
    let cluster = TestCluster::up(1, &[]);
    let token = cluster.token();
    let mut client = raw_client(&cluster.addr(0)).await;
    let get = |ticket: Vec<u8>| Ticket {
        ticket: Bytes::from(ticket),
    };
    let garbage = client
        .do_get(authorized(get(b"not a plan at all".to_vec()), &token))
        .await
        .unwrap_err();
    assert_eq!(garbage.code(), Code::InvalidArgument);
    assert!(
        garbage
            .message()
            .starts_with("device 0: stage plan envelope"),
        "{}",
        garbage.message()
    );
    let mut big = b"ISTP".to_vec();
    big.resize(17 << 20, 0xAB);
    let oversized = client
        .do_get(authorized(get(big), &token))
        .await
        .unwrap_err();
    assert_eq!(oversized.code(), Code::InvalidArgument);
    assert!(
        oversized.message().contains("plan_bytes_max"),
        "{}",
        oversized.message()
    );
    let unknown = client
        .do_action(authorized(
            Action {
                r#type: "format_disk".into(),
                body: Bytes::new(),
            },
            &token,
        ))
        .await
        .unwrap_err();
    assert!(
        unknown.message().contains("unknown action 'format_disk'"),
        "{}",
        unknown.message()
    );
    // Still serving.
    client
        .do_action(authorized(list_tables(), &token))
        .await
        .expect("server alive");
}

#[test]
fn port_in_use_gives_a_clear_message() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let (ok, _, err) = insitu(&[
        "device",
        "serve",
        "--dir",
        dir.path().to_str().unwrap(),
        "--listen",
        &addr,
    ]);
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "cannot listen for Flight on {addr}: address already in use"
        )),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_result_stream_cancels_the_device_stage() {
    // Far more than the device's result channel and HTTP/2 windows hold.
    let cluster = cluster_with_table(1_000_000);
    let slow: LinkProfile = "200000".parse().unwrap();
    let clients: Vec<Arc<dyn insitu_host::DeviceClient>> =
        insitu_flight::connect_cluster(&cluster.file, Some(slow), Default::default())
            .await
            .unwrap()
            .into_iter()
            .map(|c| c as Arc<dyn insitu_host::DeviceClient>)
            .collect();
    let config = HostConfig {
        pushdown: Pushdown::On,
        target_partitions: 2,
        ..Default::default()
    };
    let host = InsituHost::new(clients.clone(), config).await.unwrap();
    // Compressed, the results would fit the windows after all.
    host.context()
        .sql("SET insitu.result_compression = 'none'")
        .await
        .unwrap();
    let df = host.context().sql("select x * 2 from t").await.unwrap();
    let mut stream = df.execute_stream().await.unwrap();
    let first = stream.next().await.expect("a batch").unwrap();
    assert!(first.num_rows() > 0);
    drop(stream);
    let started = Instant::now();
    loop {
        let stats = clients[0].stats().await.unwrap();
        if stats.active_streams == 0 && stats.stages_cancelled >= 1 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "stage not cancelled: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
