"""What one /v1/videos job costs steward itself: its CPU time and its memory (RSS).

Run from the repository root::

    .venv/bin/python tests/benchmarks/bench_video.py [--comfyui fake|real] [--seconds 8] [--fps 8]

Method: steward (``steward run``, probe none) in front of a ComfyUI, the fake one
(``fakes.comfyui``: solid frames, a tiny WEBP) or the real 0.3.64 on CPU (``--comfyui real``,
STEWARD_COMFYUI_SRC set: frames of noise, so the WEBP is as large as a real clip's). One video
of 1280x720, ``seconds * fps`` frames, is created, polled once a second as the SDK's
``create_and_poll`` does, and downloaded once. Steward's own CPU time (utime + stime from
/proc, its children not included) is read around the job, less its idle rate measured for 3 s
before; its RSS is sampled every 0.1 s (VmRSS), and its peak (VmHWM) read at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_processes import cpu_seconds, free_port, stop  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def workflow(real: bool) -> dict[str, object]:
    nodes: dict[str, object] = {
        "1": {"class_type": "EmptyImage", "inputs": {"width": "{{width}}", "height": "{{height}}",
                                                     "batch_size": "{{frames}}", "color": 0x204080}},
        "9": {"class_type": "CLIPTextEncode", "inputs": {"text": "{{prompt}}"}}}
    frames = ["1", 0]
    if real:
        nodes["2"] = {"class_type": "ImageAddNoise", "inputs": {"image": frames, "seed": "{{seed}}", "strength": 0.3}}
        frames = ["2", 0]
    nodes["3"] = {"class_type": "SaveAnimatedWEBP", "inputs": {"images": frames, "filename_prefix": "bench/clip",
                                                               "fps": "{{fps}}", "lossless": False, "quality": 80,
                                                               "method": "default"}}
    return nodes


def start_comfyui(kind: str, folder: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    if kind == "fake":
        argv = [sys.executable, "-m", "fakes.comfyui", "--port", str(port), "--job-time", "1s", "--free-delay", "0.1s"]
        cwd = ROOT
    else:
        from fakes.comfyui_env import comfyui_install

        install = comfyui_install()
        for sub in ("custom_nodes", "input", "output", "temp", "user", "models"):
            (folder / sub).mkdir(parents=True)
        argv = [str(install.python), str(install.main), "--cpu", "--listen", "127.0.0.1", "--port", str(port),
                "--base-directory", str(folder), "--disable-auto-launch",
                "--database-url", f"sqlite:///{folder / 'user' / 'comfyui.db'}"]
        cwd = install.folder
    log = open(folder.parent / f"comfyui-{kind}.log", "wb")  # noqa: SIM115 (kept open for the child)
    process = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    wait_for(f"http://127.0.0.1:{port}/system_stats", 300)
    return process, port


def wait_for(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"bench: {url} did not answer within {timeout:g} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--comfyui", choices=["fake", "real"], default="fake")
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--fps", type=int, default=8)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-video-"))
    comfy, comfy_port = start_comfyui(args.comfyui, work / "comfyui")
    (work / "clip.json").write_text(json.dumps(workflow(args.comfyui == "real")))
    port = free_port()
    config = {"listen": f"127.0.0.1:{port}", "gpu": {"probe": "none", "budget": "16GiB"}, "models": {
        "clip": {"runtime": "comfyui", "workflow": str(work / "clip.json"),
                 "video": {"seconds": [args.seconds], "sizes": ["1280x720"], "fps": args.fps}}},
        "comfyui": {"upstream": f"127.0.0.1:{comfy_port}", "listen": None, "history_poll": "0.5s",
                    "job_timeout": "900s"},
        "videos": {"dir": str(work / "videos")}, "log": {"file": str(work / "events.jsonl"), "terminal": "warning"},
        "state_file": None, "usage": {"db": None}}
    (work / "config.yaml").write_text(json.dumps(config))
    steward = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "run", str(work / "config.yaml")], cwd=ROOT,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(work / "steward.log", "wb"))  # noqa: SIM115
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(f"{base}/healthz", 60)
        time.sleep(1.0)  # past the start's own work
        idle_start, idle_cpu = time.monotonic(), cpu_seconds(steward.pid)
        time.sleep(3.0)
        idle_rate = (cpu_seconds(steward.pid) - idle_cpu) / (time.monotonic() - idle_start)
        rss_before = rss_kib(steward.pid)
        began, cpu_before = time.monotonic(), cpu_seconds(steward.pid)
        video = httpx.post(f"{base}/v1/videos", json={"model": "clip", "prompt": "bench",
                                                       "seconds": str(args.seconds)}, timeout=30).json()
        samples = [rss_before]
        next_poll = time.monotonic()
        while True:
            samples.append(rss_kib(steward.pid))
            if time.monotonic() >= next_poll:
                status = httpx.get(f"{base}/v1/videos/{video['id']}", timeout=30).json()
                if status["status"] in ("completed", "failed"):
                    break
                next_poll += 1.0
            time.sleep(0.1)
        content = httpx.get(f"{base}/v1/videos/{video['id']}/content", timeout=60).content
        took = time.monotonic() - began
        cpu = cpu_seconds(steward.pid) - cpu_before - idle_rate * took
        print(json.dumps({"comfyui": args.comfyui, "frames": args.seconds * args.fps, "size": "1280x720",
                          "status": status["status"], "error": status["error"], "video_bytes": len(content),
                          "job_wall_s": round(took, 2), "steward_cpu_s": round(cpu, 3),
                          "steward_idle_cpu_per_s": round(idle_rate, 4),
                          "steward_rss_mib_before": round(rss_before / 1024, 1),
                          "steward_rss_mib_peak_during": round(max(samples) / 1024, 1),
                          "steward_rss_mib_after": round(rss_kib(steward.pid) / 1024, 1),
                          "steward_rss_mib_high_water": round(rss_kib(steward.pid, "VmHWM") / 1024, 1)}, indent=2))
    finally:
        stop("steward", steward)
        stop("comfyui", comfy, grace=20)
        if os.environ.get("BENCH_KEEP") is None:
            import shutil

            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
