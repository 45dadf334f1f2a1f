//! Every connection sluice opens to Redis has `TCP_NODELAY` on, standalone and cluster.
//!
//! Why it matters: redis-rs leaves Nagle's algorithm on unless told otherwise, and Nagle holds a
//! small write back while an earlier small one on the same connection is unacknowledged, so a
//! call pipelined behind another (the cluster connection does that) would wait up to a network
//! round trip. On loopback the delay is too small and too variable for a timing test, so this
//! reads the socket option itself: the test process's own sockets (the limiter runs
//! in-process), duplicated through a pidfd and asked with `getsockopt`.

use crate::helpers;

use std::collections::BTreeMap;
use std::net::SocketAddr;

use helpers::{RedisCluster, RedisServer, consume};
use sluice::limiter::Limiter;
use sluice::limiter::redis::cluster::key_slot;
use sluice::limiter::redis::{RedisLimiter, RedisOptions};

use rustix::process::{PidfdFlags, PidfdGetfdFlags, getpid, pidfd_getfd, pidfd_open};

/// `TCP_NODELAY` of each TCP socket of this process whose peer port is one of `ports`, with its
/// peer port.
fn nodelay_by_peer(ports: &[u16]) -> Vec<(u16, bool)> {
    let me = pidfd_open(getpid(), PidfdFlags::empty()).expect("pidfd_open of this process");
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").expect("list /proc/self/fd") {
        let entry = entry.expect("an fd entry");
        // An fd may close between the listing and these calls (other tests' tasks): skip it.
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        if !target.to_string_lossy().starts_with("socket:") {
            continue;
        }
        let Ok(number) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let fd = match pidfd_getfd(&me, number, PidfdGetfdFlags::empty()) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::BADF) => continue,
            Err(e) => panic!("pidfd_getfd of this process's fd {number}: {e} (needs Linux 5.6+)"),
        };
        let Ok(Some(peer)) = rustix::net::getpeername(&fd) else {
            continue;
        };
        let Ok(peer) = SocketAddr::try_from(peer) else {
            continue;
        };
        if ports.contains(&peer.port()) {
            let nodelay = rustix::net::sockopt::tcp_nodelay(&fd).expect("getsockopt TCP_NODELAY");
            found.push((peer.port(), nodelay));
        }
    }
    found
}

#[tokio::test]
async fn standalone_connections_have_nodelay() {
    let server = RedisServer::start();
    let limiter = RedisLimiter::connect(&RedisOptions {
        pool_size: 3,
        ..RedisOptions::new(server.url())
    })
    .await
    .expect("connect");
    for i in 0..6 {
        limiter
            .decide(&[consume(&format!("sluice:{{k{i}}}"), 10, 60_000)], None)
            .await
            .expect("decide");
    }
    let sockets = nodelay_by_peer(&[server.port()]);
    assert!(
        sockets.len() >= 3,
        "expected the limiter's 3 connections to Redis, found {sockets:?}"
    );
    assert!(
        sockets.iter().all(|(_, nodelay)| *nodelay),
        "a connection to Redis without TCP_NODELAY: {sockets:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_connections_have_nodelay() {
    let cluster = RedisCluster::start();
    let limiter = helpers::limiter::cluster_limiter(&cluster).await;
    // A key on every primary, so there is a connection to each.
    let mut by_node = BTreeMap::new();
    for i in 0..1000 {
        let key = format!("sluice:{{n{i}}}");
        by_node.entry(cluster.owner(key_slot(&key))).or_insert(key);
        if by_node.len() == cluster.nodes.len() {
            break;
        }
    }
    for key in by_node.into_values() {
        limiter
            .decide(&[consume(&key, 10, 60_000)], None)
            .await
            .expect("decide");
    }
    let ports: Vec<u16> = cluster.nodes.iter().map(|n| n.port()).collect();
    let sockets = nodelay_by_peer(&ports);
    for port in &ports {
        assert!(
            sockets.iter().any(|(p, _)| p == port),
            "no connection to the primary on {port}: {sockets:?}"
        );
    }
    assert!(
        sockets.iter().all(|(_, nodelay)| *nodelay),
        "a connection to a cluster node without TCP_NODELAY: {sockets:?}"
    );
}
