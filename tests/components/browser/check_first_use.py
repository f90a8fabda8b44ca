"""Browser-level check of issue 12 items 11 and 13 (manual, not part of pytest).

Runs the development instance's configuration (a copy of config/ in a temporary
folder) with Home Assistant from the current venv, the loopback OpenAI peer as the
model, and Debian's headless ``chromium`` driven over the DevTools protocol:

- item 13: the agent-brain form of the add-integration dialog shows its helper text
  and does not offer Realtime Voice's own agent;
- item 11: in the Assist dialog, a second message typed while the first answer is
  still streaming (the dialog has no conversation id yet) interrupts that answer:
  the model server sees the first request hung up, and the second request carries
  the first message (one conversation).

Run: ``python tests/components/browser/check_first_use.py`` (needs ``chromium``;
``apt-get install chromium``). Exit code 0 when every check passed.
"""

# ruff: noqa: T201 - a script that reports what it checks

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
from pathlib import Path
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import aiohttp

ROOT = Path(__file__).parents[3]
sys.path.insert(0, str(ROOT))

from tests.peers.openai_server import DEFAULT_MODEL, Hang, OpenAIPeer, Text  # noqa: E402

TIMEOUT = 60.0
USER = {"name": "Tester", "username": "tester", "password": "tester-pass-1234"}

# Finds elements and text through every shadow root (HA's frontend is made of them).
DEEP_JS = """
window.__deepAll = (sel, root = document, out = []) => {
  root.querySelectorAll(sel).forEach((e) => out.push(e));
  root.querySelectorAll('*').forEach((e) => {
    if (e.shadowRoot) window.__deepAll(sel, e.shadowRoot, out);
  });
  return out;
};
window.__deepText = (node = document.body) => {
  let text = '';
  const walk = (n) => {
    if (n.nodeName === 'STYLE' || n.nodeName === 'SCRIPT') return;
    if (n.nodeType === Node.TEXT_NODE) text += n.textContent + ' ';
    if (n.shadowRoot) walk(n.shadowRoot);
    n.childNodes.forEach(walk);
  };
  walk(node);
  return text.replace(/\\s+/g, ' ');
};
"""


def free_port() -> int:
    """Return a loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Page:
    """One chromium tab over the DevTools protocol."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """Drive the tab behind ``ws``."""
        self._ws = ws
        self._ids = itertools.count(1)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Send a DevTools command; return its result."""
        message_id = next(self._ids)
        await self._ws.send_json({"id": message_id, "method": method, "params": params})
        while True:
            reply = await self._ws.receive_json(timeout=TIMEOUT)
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return dict(reply.get("result", {}))

    async def eval(self, expression: str) -> Any:
        """Evaluate JavaScript (with the shadow-root helpers) in the page."""
        result = await self.send(
            "Runtime.evaluate",
            expression=DEEP_JS + expression,
            awaitPromise=True,
            returnByValue=True,
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def screenshot(self, name: str) -> Path:
        """Save a screenshot in the temp folder; its path."""
        shot = await self.send("Page.captureScreenshot")
        path = Path(tempfile.gettempdir()) / f"rtvoice-browser-{name}.png"
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    async def wait_for(self, expression: str, what: str) -> Any:
        """Poll until ``expression`` is truthy; dump the page when it never is."""
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            with contextlib.suppress(RuntimeError):
                if value := await self.eval(expression):
                    return value
            await asyncio.sleep(0.25)  # polling a browser page: nothing to await
        with contextlib.suppress(RuntimeError):
            print(f"  screenshot: {await self.screenshot('timeout')}")
            print(f"  page text: {(await self.eval('__deepText()'))[:1500]}")
        raise TimeoutError(f"timed out waiting for {what}")


async def onboard(http: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    """Create the owner through onboarding; return the tokens."""
    client_id = f"{base}/"
    async with http.post(
        f"{base}/api/onboarding/users",
        json={**USER, "client_id": client_id, "language": "en"},
    ) as resp:
        resp.raise_for_status()
        code = (await resp.json())["auth_code"]
    async with http.post(
        f"{base}/auth/token",
        data={"grant_type": "authorization_code", "code": code, "client_id": client_id},
    ) as resp:
        resp.raise_for_status()
        tokens = dict(await resp.json())
    headers = {"Authorization": f"Bearer {tokens['access_token']}"}
    for step, body in (
        ("core_config", {}),
        ("analytics", {}),
        ("integration", {"client_id": client_id, "redirect_uri": client_id}),
    ):
        async with http.post(
            f"{base}/api/onboarding/{step}", json=body, headers=headers
        ) as resp:
            resp.raise_for_status()
    return tokens


async def add_openai_entry(
    http: aiohttp.ClientSession, base: str, token: str, peer: OpenAIPeer
) -> None:
    """Add Realtime Voice on the peer through the config flow's REST API."""
    headers = {"Authorization": f"Bearer {token}"}
    url = f"{base}/api/config/config_entries/flow"
    async with http.post(url, json={"handler": "rtvoice"}, headers=headers) as resp:
        flow = await resp.json()
    async with http.post(
        f"{url}/{flow['flow_id']}", json={"next_step_id": "openai"}, headers=headers
    ) as resp:
        await resp.json()
    async with http.post(
        f"{url}/{flow['flow_id']}",
        json={
            "name": "Realtime Voice",
            "base_url": peer.base_url,
            "model": DEFAULT_MODEL,
        },
        headers=headers,
    ) as resp:
        created = await resp.json()
    assert created["type"] == "create_entry", created


async def use_agent_in_preferred_pipeline(
    http: aiohttp.ClientSession, base: str, token: str
) -> None:
    """Make Realtime Voice the agent of the preferred pipeline (the dialog's)."""
    async with http.ws_connect(f"{base.replace('http', 'ws')}/api/websocket") as ws:
        await ws.receive_json()
        await ws.send_json({"type": "auth", "access_token": token})
        await ws.receive_json()
        await ws.send_json({"id": 1, "type": "assist_pipeline/pipeline/list"})
        listed = (await ws.receive_json())["result"]
        pipeline = next(
            p for p in listed["pipelines"] if p["id"] == listed["preferred_pipeline"]
        )
        pipeline.update(
            conversation_engine="conversation.realtime_voice",
            conversation_language="*",
        )
        pipeline_id = pipeline.pop("id")
        await ws.send_json(
            {
                "id": 2,
                "type": "assist_pipeline/pipeline/update",
                "pipeline_id": pipeline_id,
                **pipeline,
            }
        )
        reply = await ws.receive_json()
        assert reply["success"], reply


async def check_agent_form(page: Page, base: str) -> list[str]:
    """Item 13: helper text renders, Realtime Voice's agent is not offered."""
    problems = []
    await page.send(
        "Page.navigate", url=f"{base}/config/integrations/dashboard/add?domain=rtvoice"
    )
    # "Do you want to set up Realtime Voice?"
    await page.wait_for(
        "(() => { const ok = __deepAll('mwc-button, ha-button').find("
        "(e) => e.textContent.trim() === 'OK'); if (ok) ok.click(); return !!ok; })()",
        "the set-up confirmation",
    )
    await page.wait_for(
        "__deepAll('ha-list-item, mwc-list-item, ha-md-list-item').some("
        "(e) => e.textContent.includes('Home Assistant conversation agent'))",
        "the brain menu",
    )
    await page.eval(
        "__deepAll('ha-list-item, mwc-list-item, ha-md-list-item').find("
        "(e) => e.textContent.includes('Home Assistant conversation agent')).click()"
    )
    helper = (
        "The agent that answers. The built-in Home Assistant agent works fully offline."
    )
    text = await page.wait_for(
        f"__deepText().includes({json.dumps(helper)}) && __deepText()", "the agent form"
    )
    if helper not in text:
        problems.append("13: the agent field's helper text is not shown")
    await page.screenshot("agent-form")
    # The agent field is a combo box: the items it offers when opened.
    options = await page.eval(
        "__deepAll('ha-combo-box').flatMap((c) => (c.items || []).map("
        "(i) => (typeof i === 'object' ? i.value : i)))"
    )
    print(f"  agent form options: {options}")
    if any("realtime_voice" in str(o) or str(o) == "Realtime Voice" for o in options):
        problems.append("13: Realtime Voice's own agent is offered")
    if not any(
        "home_assistant" in str(o) or "Home Assistant" in str(o) for o in options
    ):
        problems.append("13: the built-in agent is not offered")
    return problems


async def type_in_assist(page: Page, text: str) -> None:
    """Type a request into the Assist dialog's field and press Enter, as a user."""
    await page.eval(
        "__deepAll('ha-textfield').find((f) => (f.label || '').includes('request'))"
        ".focus()"
    )
    await page.send("Input.insertText", text=text)
    for kind in ("keyDown", "keyUp"):
        await page.send(
            "Input.dispatchKeyEvent",
            type=kind,
            key="Enter",
            code="Enter",
            windowsVirtualKeyCode=13,
            text="\r",
        )


async def check_assist_barge_in(page: Page, base: str, peer: OpenAIPeer) -> list[str]:
    """Item 11: a message typed during the first answer interrupts it."""
    problems = []
    peer.enqueue(Text("Once upon a time"), Hang())
    peer.enqueue(Text("Stopping now."))
    await page.send("Page.navigate", url=f"{base}/lovelace/0")
    await page.wait_for(
        "__deepAll('ha-menu-button, hui-root').length > 0", "the dashboard"
    )
    # The "a" shortcut opens Assist, as in the UI.
    await page.wait_for("document.readyState === 'complete'", "the dashboard page")
    for kind in ("keyDown", "keyUp"):
        await page.send(
            "Input.dispatchKeyEvent",
            type=kind,
            key="a",
            code="KeyA",
            text="a",
            windowsVirtualKeyCode=65,
        )
    await page.wait_for(
        "__deepAll('ha-textfield').some((f) => (f.label || '').includes('request'))",
        "the Assist dialog",
    )
    await type_in_assist(page, "tell me a long story")
    first = await asyncio.wait_for(peer.wait_for_request(1), TIMEOUT)
    await page.wait_for(
        "__deepText(__deepAll('ha-voice-command-dialog')[0]).includes('Once upon a time')",
        "the first answer streaming",
    )
    await type_in_assist(page, "stop, thanks")
    second = await asyncio.wait_for(peer.wait_for_request(2), TIMEOUT)
    try:
        await asyncio.wait_for(first.disconnected.wait(), TIMEOUT)
    except TimeoutError:
        problems.append("11: the first answer kept streaming at the model")
    said = [m.get("content") for m in second.messages if m.get("role") == "user"]
    print(f"  second request's user messages: {said}")
    if "tell me a long story" not in said:
        problems.append("11: the second message started a separate conversation")
    await page.wait_for(
        "__deepText(__deepAll('ha-voice-command-dialog')[0]).includes('Stopping now.')",
        "the second answer",
    )
    return problems


async def main() -> int:
    """Run the checks; 0 when all passed."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    workdir = Path(tempfile.mkdtemp(prefix="rtvoice-browser-"))
    config = workdir / "config"
    (config / "custom_components").mkdir(parents=True)
    text = (ROOT / "config/configuration.yaml").read_text()
    (config / "configuration.yaml").write_text(
        text.replace("server_port: 8123", f"server_port: {port}")
    )
    (config / "automations.yaml").write_text("[]")
    (config / "scripts.yaml").write_text("")
    (config / "scenes.yaml").write_text("")
    (config / "custom_components/rtvoice").symlink_to(
        ROOT / "custom_components/rtvoice"
    )
    shutil.copytree(
        ROOT / "config/custom_components/rtvoice_dev",
        config / "custom_components/rtvoice_dev",
    )
    peer = OpenAIPeer()
    await peer.start()
    hass_log = (workdir / "hass.log").open("w")
    hass = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "homeassistant", "-c", str(config), "--skip-pip"],
        stdout=hass_log,
        stderr=subprocess.STDOUT,
    )
    cdp_port = free_port()
    browser = await asyncio.create_subprocess_exec(
        *[
            "chromium",
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--window-size=1280,900",
            f"--remote-debugging-port={cdp_port}",
            f"--user-data-dir={workdir / 'chromium'}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    problems: list[str] = []
    try:
        async with aiohttp.ClientSession() as http:
            deadline = time.monotonic() + TIMEOUT
            while True:
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"{base}/api/onboarding") as resp:
                        if resp.status == 200:
                            break
                if time.monotonic() > deadline:
                    raise TimeoutError("Home Assistant did not start")
                await asyncio.sleep(0.5)  # waiting for another process to listen
            tokens = await onboard(http, base)
            await add_openai_entry(http, base, tokens["access_token"], peer)
            await use_agent_in_preferred_pipeline(http, base, tokens["access_token"])

            while True:
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(
                        f"http://127.0.0.1:{cdp_port}/json/list"
                    ) as resp:
                        targets = [t for t in await resp.json() if t["type"] == "page"]
                        if targets:
                            break
                await asyncio.sleep(0.25)  # waiting for chromium to listen
            async with http.ws_connect(
                targets[0]["webSocketDebuggerUrl"], max_msg_size=0
            ) as ws:
                page = Page(ws)
                await page.send("Page.enable")
                await page.send("Runtime.enable")
                await page.send("Page.navigate", url=f"{base}/")
                stored = {
                    "access_token": tokens["access_token"],
                    "refresh_token": tokens["refresh_token"],
                    "token_type": "Bearer",
                    "expires_in": tokens["expires_in"],
                    "hassUrl": base,
                    "clientId": f"{base}/",
                    "expires": int(time.time() * 1000) + tokens["expires_in"] * 1000,
                }
                await page.wait_for("document.readyState === 'complete'", "the page")
                await page.eval(
                    f"localStorage.setItem('hassTokens', {json.dumps(json.dumps(stored))})"
                )
                print("item 13: the agent-brain form")
                problems += await check_agent_form(page, base)
                print("item 11: barge-in in the Assist dialog's first turn")
                problems += await check_assist_barge_in(page, base, peer)
    finally:
        browser.terminate()
        hass.terminate()
        await browser.wait()
        await hass.wait()
        await peer.stop()
        hass_log.close()
    for problem in problems:
        print(f"FAILED {problem}")
    print("all browser checks passed" if not problems else f"log: {workdir}")
    if not problems:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
