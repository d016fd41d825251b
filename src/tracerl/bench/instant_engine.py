"""An engine that answers instantly with a fixed completion: the peer for gateway benchmarks.

`python -m tracerl.bench.instant_engine --port 0 --reply-ids 1,2,3` serves `/generate` (plain and
streaming) and `/get_model_info` on 127.0.0.1 and prints its URL. Every reply is the same ids with
log-probability -0.5, so what a benchmark measures is the caller's own overhead.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from aiohttp import web

from tracerl import eventloop


def build_app(reply_ids: list[int], eos_id: int) -> web.Application:
    def reply(body: dict, ids: list[int], finish: str | None) -> dict:
        return {
            "text": "",
            "output_ids": ids,
            "meta_info": {
                "id": body.get("rid", ""),
                "finish_reason": {"type": finish} if finish else None,
                "prompt_tokens": len(body.get("input_ids", [])),
                "completion_tokens": len(ids),
                "output_token_logprobs": [[-0.5, i, None] for i in ids],
                "weight_version": 0,
            },
        }

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        limit = (body.get("sampling_params") or {}).get("max_new_tokens") or len(reply_ids)
        ids = reply_ids[:limit]
        finish = "stop" if len(ids) == len(reply_ids) else "length"
        if not body.get("stream"):
            return web.json_response(reply(body, ids, finish))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(
            f"data: {json.dumps(reply(body, ids, finish))}\n\ndata: [DONE]\n\n".encode()
        )
        await resp.write_eof()
        return resp

    async def model_info(request: web.Request) -> web.Response:
        return web.json_response({"eos_token_ids": [eos_id], "weight_version": 0})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/generate", generate)
    app.router.add_get("/get_model_info", model_info)
    return app


async def _main(args: argparse.Namespace) -> None:
    ids = [int(x) for x in args.reply_ids.split(",") if x]
    runner = web.AppRunner(build_app(ids, args.eos_id), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port)
    await site.start()
    print(f"instant engine: http://127.0.0.1:{runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--reply-ids", required=True)
    parser.add_argument("--eos-id", type=int, default=2)
    eventloop.run(_main(parser.parse_args()))
