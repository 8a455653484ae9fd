"""Signs in to the web inbox with a token, as a browser would (the sign-in cookie and its csrf
field, then the session cookie), and lists the inbox page PATH: the runs it shows, each with its
quorum cell. Standard library only.

    inbox_client.py PORT TOKEN PATH

Prints {"runs": [{"run_id": ..., "quorum": ...}, ...]}.
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


def main(port, token, path):
    cookies = {}
    _, page = request(port, "GET", "/inbox/sign-in", cookies)
    csrf = re.search(r'name="csrf" value="([^"]*)"', page).group(1)
    body = urllib.parse.urlencode({"csrf": html.unescape(csrf), "token": token})
    status, _ = request(port, "POST", "/inbox/sign-in", cookies, body)
    assert status in (200, 303), status
    status, page = request(port, "GET", path, cookies)
    assert status == 200, (status, page)
    runs = []
    for row in re.finditer(r'data-run-id="([^"]+)".*?<td class="quorum">(.*?)</td>', page, re.S):
        runs.append({"run_id": row.group(1), "quorum": html.unescape(row.group(2))})
    print(json.dumps({"runs": runs}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
