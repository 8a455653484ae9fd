//! The web inbox at the HTTP level: sign-in, the session cookie, CSRF, the headers, escaping.
//! (The browser test in `tests/e2e/inbox.rs` drives the same pages in Chromium.)

use axum::http::Method;
use sqlx::PgPool;

use crate::support::{harness, Harness, Reply};

/// The sign-in form as a browser gets it: the `name=value` of its cookie, and its CSRF token.
async fn sign_in_form(h: &Harness) -> (String, String) {
    let page = h.send(Method::GET, "/inbox/sign-in", &[], None).await;
    assert_eq!(page.status, 200);
    let cookie = page.header("set-cookie").expect("a sign-in cookie");
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(attribute), "{cookie}");
    }
    let cookie = cookie.split(';').next().unwrap().to_owned();
    (cookie, hidden(&page.text(), "csrf"))
}

/// Posts the sign-in form with `token`, from the page `form` rendered.
async fn post_sign_in(h: &Harness, form: &(String, String), token: &str) -> Reply {
    let (cookie, csrf) = form;
    h.send(
        Method::POST,
        "/inbox/sign-in",
        &[
            ("content-type", "application/x-www-form-urlencoded"),
            ("cookie", cookie),
        ],
        Some(format!("csrf={csrf}&token={token}").into_bytes()),
    )
    .await
}

/// Signs in with `token`; returns the `name=value` of the session cookie.
async fn sign_in(h: &Harness, token: &str) -> String {
    let form = sign_in_form(h).await;
    let reply = post_sign_in(h, &form, token).await;
    assert_eq!(reply.status, 303, "{}", reply.text());
    assert_eq!(reply.header("location"), Some("/inbox"));
    let cookie = reply.header("set-cookie").expect("a session cookie");
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(attribute), "{cookie}");
    }
    cookie.split(';').next().unwrap().to_owned()
}

fn hidden(page: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let start = page
        .find(&marker)
        .unwrap_or_else(|| panic!("no {name} in {page}"))
        + marker.len();
    page[start..].split('"').next().unwrap().to_owned()
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn every_inbox_page_forbids_scripts_framing_and_sniffing(pool: PgPool) {
    let h = harness(pool).await;
    let page = h.send(Method::GET, "/inbox/sign-in", &[], None).await;
    assert_eq!(page.status, 200);
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    let csp = page.header("content-security-policy").unwrap();
    assert_eq!(csp, countersign_api::CONTENT_SECURITY_POLICY);
    assert!(
        csp.contains("default-src 'none'")
            && csp.contains("script-src 'self';")
            && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    assert_eq!(page.header("x-frame-options"), Some("DENY"));
    assert_eq!(page.header("x-content-type-options"), Some("nosniff"));
    assert!(
        !page.text().contains("<script>")
            && page
                .text()
                .contains(r#"<script src="/inbox/static/inbox.js" defer"#),
        "no inline script; only the shortcuts' file"
    );

    // Not signed in: the inbox sends the browser to sign in; a wrong token says so.
    let inbox = h.send(Method::GET, "/inbox", &[], None).await;
    assert_eq!(inbox.status, 303);
    assert_eq!(inbox.header("location"), Some("/inbox/sign-in"));
    let form = sign_in_form(&h).await;
    let wrong = post_sign_in(&h, &form, "cst_wrong").await;
    assert_eq!(wrong.status, 401);
    assert!(wrong.header("set-cookie").is_none());
    assert!(wrong.text().contains("did not sign you in"));
    assert_eq!(hidden(&wrong.text(), "csrf"), form.1, "the same form again");
    h.finish().await;
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_sign_in_from_a_form_this_inbox_did_not_render_is_refused(pool: PgPool) {
    let h = harness(pool).await;
    let token = h.token("admin").await;
    let (cookie, csrf) = sign_in_form(&h).await;
    // Another site's form: no sign-in cookie (SameSite=Strict), or a token it made up.
    for (cookie, csrf) in [
        (String::new(), csrf.clone()),
        (cookie.clone(), "0".repeat(64)),
        (cookie.clone(), String::new()),
    ] {
        let refused = post_sign_in(&h, &(cookie, csrf), &token).await;
        assert_eq!(refused.status, 403, "{}", refused.text());
        assert!(
            refused.text().contains("csrf_rejected"),
            "{}",
            refused.text()
        );
        assert!(refused.header("set-cookie").is_none(), "no session");
    }
    assert_eq!(
        h.count("SELECT count(*) FROM web_sessions").await,
        0,
        "no session was opened"
    );
    // The form this inbox rendered signs in, and its cookie is cleared.
    let signed_in = post_sign_in(&h, &(cookie, csrf), &token).await;
    assert_eq!(signed_in.status, 303, "{}", signed_in.text());
    let cookies: Vec<&str> = signed_in
        .headers
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert!(
        cookies
            .iter()
            .any(|c| c.starts_with("countersign-sign-in=;") && c.contains("Max-Age=0")),
        "{cookies:?}"
    );
    h.finish().await;
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_card_page_shows_a_preview_with_markup_as_text(pool: PgPool) {
    let h = harness(pool).await;
    let run_id = h.suspended_run().await;
    let cookie = sign_in(&h, &h.token("admin").await).await;
    let page = h
        .send(
            Method::GET,
            &format!("/inbox/runs/{run_id}"),
            &[("cookie", &cookie)],
            None,
        )
        .await;
    assert_eq!(page.status, 200, "{}", page.text());
    let html = page.text();
    assert_eq!(
        html.matches("<script").count(),
        1,
        "the model's markup is not markup, the shortcuts' file is the one script: {html}"
    );
    assert!(!html.contains("<b>for"), "{html}");
    assert!(
        html.contains("&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt;"),
        "{html}"
    );
    assert!(html.contains("field image: 2 reference(s) → 3, appended last"));
    assert!(html.contains("Captured when the run paused — the target may have changed since."));
    assert_eq!(hidden(&html, "suspension_seq"), "1");
    assert_eq!(hidden(&html, "turn_digest").len(), 64);
    h.finish().await;
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_decision_form_without_its_sessions_csrf_token_is_refused_and_changes_nothing(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let run_id = h.suspended_run().await;
    let cookie = sign_in(&h, &h.token("admin").await).await;
    let page = h
        .send(
            Method::GET,
            &format!("/inbox/runs/{run_id}"),
            &[("cookie", &cookie)],
            None,
        )
        .await
        .text();
    let (csrf, seq, digest, decision) = (
        hidden(&page, "csrf"),
        hidden(&page, "suspension_seq"),
        hidden(&page, "turn_digest"),
        hidden(&page, "decision_id"),
    );
    let before = h.row(run_id).await;
    let path = format!("/inbox/runs/{run_id}/decide");
    let post = |form: String, extra: Option<(&'static str, &'static str)>| {
        let cookie = cookie.clone();
        let path = path.clone();
        let h = &h;
        async move {
            let mut headers = vec![
                ("cookie", cookie.as_str()),
                ("content-type", "application/x-www-form-urlencoded"),
            ];
            headers.extend(extra);
            h.send(Method::POST, &path, &headers, Some(form.into_bytes()))
                .await
        }
    };
    let form = |csrf: &str| {
        format!(
            "csrf={csrf}&decision_id={decision}&suspension_seq={seq}&turn_digest={digest}&approved=true"
        )
    };

    for (body, extra) in [
        (form(""), None),
        (form(&"0".repeat(64)), None),
        (form(&csrf), Some(("sec-fetch-site", "cross-site"))),
    ] {
        let refused = post(body, extra).await;
        assert_eq!(refused.status, 403, "{}", refused.text());
        assert!(refused.text().contains("csrf_rejected"));
    }
    assert_eq!(h.row(run_id).await, before, "nothing changed");

    // With it, the decision goes through the gates, and a second submission replays it.
    let accepted = post(form(&csrf), None).await;
    assert_eq!(accepted.status, 200, "{}", accepted.text());
    assert!(accepted.text().contains("Decision accepted"));
    let again = post(form(&csrf), None).await;
    assert!(again.text().contains("Decision accepted"));
    let decisions: i64 = h
        .count(&format!(
            "SELECT count(*) FROM run_decisions WHERE run_id = '{run_id}'"
        ))
        .await;
    assert_eq!(
        decisions, 1,
        "the form's decision id made the second a replay"
    );

    // Signing out ends the session.
    let out = h
        .send(
            Method::POST,
            "/inbox/sign-out",
            &[
                ("cookie", &cookie),
                ("content-type", "application/x-www-form-urlencoded"),
            ],
            Some(format!("csrf={csrf}").into_bytes()),
        )
        .await;
    assert_eq!(out.status, 303);
    let after = h
        .send(Method::GET, "/inbox", &[("cookie", &cookie)], None)
        .await;
    assert_eq!(after.header("location"), Some("/inbox/sign-in"));
    h.finish().await;
}

#[sqlx::test(migrator = "countersign_content::WITH_ENGINE")]
async fn a_user_signed_in_by_a_trusted_proxy_decides_as_the_proxys_producer(pool: PgPool) {
    let h = crate::support::harness_with(
        pool,
        countersign_api::ApiConfig {
            trusted_header: Some(axum::http::HeaderName::from_static("x-forwarded-user")),
            trusted_proxies: vec!["127.0.0.1".parse().unwrap()],
            proxy_producer: "sso".into(),
            ..crate::support::config()
        },
    )
    .await;
    let run_id = h.suspended_run().await;
    let as_admin = [("x-forwarded-user", "admin")];

    // The first visit opens the session: no sign-in page.
    let first = h
        .send(
            Method::GET,
            &format!("/inbox/runs/{run_id}"),
            &as_admin,
            None,
        )
        .await;
    assert_eq!(first.status, 200, "{}", first.text());
    let cookie = first
        .header("set-cookie")
        .expect("a session")
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let page = first.text();
    assert!(
        page.contains("Signed in as") && !page.contains("sign-out"),
        "{page}"
    );
    let form = format!(
        "csrf={}&decision_id={}&suspension_seq={}&turn_digest={}&approved=true",
        hidden(&page, "csrf"),
        hidden(&page, "decision_id"),
        hidden(&page, "suspension_seq"),
        hidden(&page, "turn_digest"),
    );
    let decide = |cookie: String, form: String| {
        let h = &h;
        async move {
            h.send(
                Method::POST,
                &format!("/inbox/runs/{run_id}/decide"),
                &[
                    ("x-forwarded-user", "admin"),
                    ("cookie", &cookie),
                    ("content-type", "application/x-www-form-urlencoded"),
                ],
                Some(form.into_bytes()),
            )
            .await
        }
    };

    // The proxy's producer may not vouch for approvers until a grant says so.
    let refused = decide(cookie.clone(), form.clone()).await;
    assert_eq!(refused.status, 403, "{}", refused.text());
    assert!(refused.text().contains("unauthenticated_producer"));
    countersign_coordinator::producers::allow(
        &h.pool,
        "sso",
        countersign_coordinator::ProducerKind::Approver,
        "*",
    )
    .await
    .unwrap();
    let refresh = h
        .send(
            Method::GET,
            &format!("/inbox/runs/{run_id}"),
            &[("x-forwarded-user", "admin"), ("cookie", &cookie)],
            None,
        )
        .await;
    let page = refresh.text();
    let form = format!(
        "csrf={}&decision_id={}&suspension_seq={}&turn_digest={}&approved=true",
        hidden(&page, "csrf"),
        hidden(&page, "decision_id"),
        hidden(&page, "suspension_seq"),
        hidden(&page, "turn_digest"),
    );
    let accepted = decide(cookie.clone(), form).await;
    assert_eq!(accepted.status, 200, "{}", accepted.text());
    assert!(accepted.text().contains("Decision accepted"));

    // The session is good only while the proxy vouches for the same user.
    let alone = h
        .send(Method::GET, "/inbox", &[("cookie", &cookie)], None)
        .await;
    assert_eq!(alone.header("location"), Some("/inbox/sign-in"));
    h.finish().await;
}
