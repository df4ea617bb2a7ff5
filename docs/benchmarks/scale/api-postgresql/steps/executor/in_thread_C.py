# in_thread of arm C: fathom/api/handoff.py as at be4bd1d with this in place of its in_thread (not committed)
async def in_thread(fn, *args, **kwargs):
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    context = contextvars.copy_context()

    def call():
        if future.cancelled():
            return
        try:
            result = context.run(fn, *args, **kwargs)
        except BaseException as e:  # noqa: BLE001
            loop.call_soon_threadsafe(_settle, future, None, e)
        else:
            loop.call_soon_threadsafe(_settle, future, result, None)
    executor().submit(call)
    return await future


def _settle(future, result, error):
    if not future.cancelled():
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
