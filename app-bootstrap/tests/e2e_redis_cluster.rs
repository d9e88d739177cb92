//! End to end with the `redis` provider on a Redis Cluster (three masters,
//! one replica each) that this test spawns on free ports, and the
//! `redis-acl` rule for a cluster applied to every node.

mod support;

use app_bootstrap::acl::acl_rules;
use redis_fixture::RedisCluster;
use reqwest::StatusCode;
use support::{
    GCRA_ORDERS, IN_FLIGHT_WORK, Running, fixed_window_config, gcra_burst_then_429, load,
    three_allowed_then_429, two_in_flight_then_429,
};

const USER: &str = "e2e-cluster-acl";
const PASSWORD: &str = "e2e-cluster-acl-password";

fn cluster_config(id: &str, cluster: &RedisCluster, user: &str) -> String {
    let urls = cluster.urls().iter().map(|url| format!("\"{url}\"")).collect::<Vec<_>>().join(", ");
    let extra = format!(
        "[redis]\nenabled = true\ntopology = \"cluster\"\nurls = [{urls}]\nkey-prefix = \"e2e:\"\n{user}"
    );
    fixed_window_config(id, "redis", &extra)
}

#[tokio::test]
async fn a_cluster_limits_every_route_and_the_acl_rule_suffices_on_every_node() {
    let cluster = RedisCluster::start();

    // As the default user.
    let config = load(&cluster_config("e2e-cluster", &cluster, ""));
    let server = Running::start(&config).await;
    assert_eq!(server.get("/readyz").await.status, StatusCode::OK);
    three_allowed_then_429(&server, "e2e-cluster", "/api/hello").await;
    server.stop().await;

    // A GCRA policy on the cluster, through the layer.
    let config = load(&format!("{}{GCRA_ORDERS}", cluster_config("e2e-cluster-g", &cluster, "")));
    let server = Running::start(&config).await;
    gcra_burst_then_429(&server).await;
    server.stop().await;

    // An in-flight limit on the cluster, through the layer.
    let config =
        load(&format!("{}{IN_FLIGHT_WORK}", cluster_config("e2e-cluster-l", &cluster, "")));
    let server = Running::start(&config).await;
    two_in_flight_then_429(&server).await;
    server.stop().await;

    // As the least-privilege user, the rule applied to every node.
    let credentials = format!("username = \"{USER}\"\npassword = \"{PASSWORD}\"\n");
    let config = load(&cluster_config("e2e-cluster-acl", &cluster, &credentials));
    let rules = acl_rules(&config.redis);
    let words: Vec<&str> = rules.commands[0].split(' ').collect();
    for port in cluster.ports() {
        assert_eq!(cluster.cli(port, &words), "OK", "node {port}");
    }
    let server = Running::start(&config).await;
    assert_eq!(server.get("/readyz").await.status, StatusCode::OK);
    three_allowed_then_429(&server, "e2e-cluster-acl", "/api/hello").await;
    // Another operation is another key, most likely on another master.
    let order = server.get("/api/orders/1").await;
    assert_eq!(order.status, StatusCode::OK, "{}\n{}", order.body, acl_log(&cluster));
    server.stop().await;
    assert!(acl_log(&cluster).is_empty(), "denied commands:\n{}", acl_log(&cluster));
}

/// Every node's ACL log entries (denied commands), empty when none.
fn acl_log(cluster: &RedisCluster) -> String {
    cluster
        .ports()
        .into_iter()
        .map(|port| cluster.cli(port, &["ACL", "LOG"]))
        .filter(|log| !log.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}
