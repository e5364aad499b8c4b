"""Start labs.server in this process on 127.0.0.1, on a port the OS picks, for the server and load-generator tests."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time

from labs.engine.config import ModelConfig
from labs.server.__main__ import TINY


def tiny_llm(**engine):
    from labs.engine import LLM

    cfg = ModelConfig.from_spec("llama-3.1-8b").replace(**TINY)
    args = dict(model_config=cfg, device="cpu", dtype="float32", decode_attention="torch", cuda_graphs=False,
                max_model_len=256, max_num_seqs=8, max_num_batched_tokens=128, block_size=8, num_blocks=96)
    args.update(engine)
    return LLM(**args)


@contextlib.contextmanager
def running(app):
    """Serve `app` with uvicorn in a thread; yields the base URL, stops the server on exit.

    torch runs on one thread meanwhile: on a shared 2-core machine its thread pool makes the
    tiny model's steps several times slower, not faster.
    """
    import torch
    import uvicorn

    threads = torch.get_num_threads()
    torch.set_num_threads(1)

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()
        torch.set_num_threads(threads)


def wait_until(check, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()
