"""Signs in to the web inbox with a token, as a browser would (the sign-in cookie and its csrf
field, then the session cookie), and either lists the inbox page PATH — the runs it shows, each
with its quorum cell — or, with --approve-with-grant, opens the run page PATH and presses
"Approve, and approve the same for 8 hours" when the card offers it. Standard library only.

    inbox_client.py PORT TOKEN PATH
    inbox_client.py PORT TOKEN /inbox/runs/RUN_ID --approve-with-grant

Prints {"runs": [{"run_id": ..., "quorum": ...}, ...]}, or {"offered": bool, "status": ...,
"outcome": ..., "grant": ...} (the outcome page's code and grant sentence).
"""

import html
import http.client
import json
import re
import sys
import urllib.parse


def request(port, method, path, cookies, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=30)
    headers = {"Host": f"127.0.0.1:{port}"}
    if cookies:
        headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())
    if body is not None:
        headers["Content-Type"] = "application/x-www-form-urlencoded"
        headers["Origin"] = f"http://127.0.0.1:{port}"
        headers["Sec-Fetch-Site"] = "same-origin"
    conn.request(method, path, body=body, headers=headers)
    response = conn.getresponse()
    for name, value in response.getheaders():
        if name.lower() == "set-cookie":
            pair = value.split(";", 1)[0]
            k, _, v = pair.partition("=")
            cookies[k.strip()] = v.strip()
    return response.status, response.read().decode()


def hidden(page, name):
    return html.unescape(re.search(rf'name="{name}" value="([^"]*)"', page).group(1))


def approve_with_grant(port, cookies, path):
    status, page = request(port, "GET", path, cookies)
    assert status == 200, (status, page)
    offered = 'id="approve-grant"' in page
    result = {"offered": offered, "status": None, "outcome": None, "grant": None}
    if offered:
        form = {n: hidden(page, n) for n in ("csrf", "decision_id", "suspension_seq", "turn_digest")}
        form["approved"] = "grant"
        status, page = request(port, "POST", path + "/decide", cookies, urllib.parse.urlencode(form))
        result["status"] = status
        code = re.search(r'<code id="outcome-code">([^<]*)</code>', page)
        result["outcome"] = code and code.group(1)
        grant = re.search(r'<p[^>]*id="grant-outcome"[^>]*>(.*?)</p>', page, re.S)
        result["grant"] = grant and html.unescape(re.sub(r"<[^>]+>", "", grant.group(1)))
    print(json.dumps(result))


def main(port, token, path, mode=None):
    cookies = {}
    _, page = request(port, "GET", "/inbox/sign-in", cookies)
    csrf = re.search(r'name="csrf" value="([^"]*)"', page).group(1)
    body = urllib.parse.urlencode({"csrf": html.unescape(csrf), "token": token})
    status, _ = request(port, "POST", "/inbox/sign-in", cookies, body)
    assert status in (200, 303), status
    if mode == "--approve-with-grant":
        return approve_with_grant(port, cookies, path)
    status, page = request(port, "GET", path, cookies)
    assert status == 200, (status, page)
    runs = []
    for row in re.finditer(r'data-run-id="([^"]+)".*?<td class="quorum">(.*?)</td>', page, re.S):
        runs.append({"run_id": row.group(1), "quorum": html.unescape(row.group(2))})
    print(json.dumps({"runs": runs}))


if __name__ == "__main__":
    main(*sys.argv[1:5])
