//! `/v1/groups`: administrators create groups and change their members, every change audited
//! with the caller; a name the directory cannot hold is refused by name; anyone else finds
//! nothing there.

use axum::http::Method;
use sqlx::PgPool;

use crate::support::harness;

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn an_administrator_manages_groups_audited_and_a_bad_name_is_refused_malformed(pool: PgPool) {
    let h = harness(pool).await;
    let admin = h.token("admin").await;
    let auth = format!("Bearer {admin}");
    let headers = [("authorization", auth.as_str())];
    let put = |path: &'static str| h.send(Method::PUT, path, &headers, None);

    assert_eq!(put("/v1/groups/legal").await.status, 204);
    assert_eq!(
        put("/v1/groups/legal").await.status,
        204,
        "again: no change"
    );
    assert_eq!(put("/v1/groups/legal/members/alice").await.status, 204);
    put("/v1/groups/nobody/members/alice")
        .await
        .problem(404, "not_found");
    let listed = h.get(&admin, "/v1/groups").await;
    assert_eq!(listed.status, 200);
    assert_eq!(
        listed.json(),
        serde_json::json!([{"name": "legal", "members": ["alice"]}])
    );

    for bad in [
        "/v1/groups/%C3%82x%28",
        "/v1/groups/-legal",
        "/v1/groups/a%20b",
    ] {
        let refused = h
            .send(Method::PUT, bad, &[("authorization", &auth)], None)
            .await
            .problem(422, "malformed");
        assert_eq!(refused["reason"], "invalid_path:group", "{bad}");
    }
    let groups: i64 = sqlx::query_scalar("SELECT count(*) FROM approver_groups")
        .fetch_one(&h.pool)
        .await
        .unwrap();
    assert_eq!(groups, 1, "nothing was created for a refused name");

    let removed = h
        .send(
            Method::DELETE,
            "/v1/groups/legal/members/alice",
            &[("authorization", &auth)],
            None,
        )
        .await;
    assert_eq!(removed.status, 204);
    h.send(
        Method::DELETE,
        "/v1/groups/legal/members/alice",
        &[("authorization", &auth)],
        None,
    )
    .await
    .problem(404, "not_found");
    let audited: Vec<(String, String)> =
        sqlx::query_as("SELECT actor, action FROM directory_audit ORDER BY id")
            .fetch_all(&h.pool)
            .await
            .unwrap();
    assert_eq!(
        audited,
        [
            ("admin", "group_created"),
            ("admin", "member_added"),
            ("admin", "member_removed")
        ]
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
    );

    // To anyone else the paths hold nothing.
    let editor = h.token("editor").await;
    h.get(&editor, "/v1/groups").await.problem(404, "not_found");
    h.finish().await;
}
