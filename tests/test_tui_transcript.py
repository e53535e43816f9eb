"""The transcript stands its history down while a reply streams (hidden behind a stand-in of the
same height, so a streamed update lays out only what is near the screen) and brings it back,
without moving what the user sees."""

from __future__ import annotations

from pathlib import Path

from textual.app import App

from velo_chat.app.screens import chat
from velo_chat.app.widgets.transcript.message import MessageView
from velo_chat.app.widgets.transcript.transcript import Transcript
from velo_chat.store import Message

ANSWER = "\n\n".join(
    [
        "## A heading",
        "A paragraph that wraps over a few lines of the transcript at this width, twice over. " * 2,
        "- **one**: a list item\n- **two**: another\n- **three**: a third",
        "```python\nx = 1\ny = 2\n```",
    ]
)


def history(n: int) -> list[Message]:
    return [
        Message(
            i,
            "s",
            i,
            role,
            f"question {i}" if role == "user" else f"answer {i}\n\n{ANSWER}",
            "complete",
            None,
            None,
            {},
            0.0,
        )
        for i, role in enumerate(["user", "assistant"] * n)
    ]


class TranscriptApp(App):
    CSS_PATH = Path(chat.__file__).parent / chat.ChatScreen.CSS_PATH  # the messages' real styles

    def compose(self):
        yield Transcript(id="transcript")


async def shown_at_bottom(pilot) -> Transcript:
    transcript = pilot.app.query_one(Transcript)
    await transcript.show_messages(history(8))
    await pilot.pause()
    transcript.scroll_end(animate=False, immediate=True)
    await pilot.pause()
    return transcript


async def test_history_above_the_screen_is_stood_down_without_moving_the_view():
    app = TranscriptApp()
    async with app.run_test(size=(80, 24)) as pilot:
        transcript = await shown_at_bottom(pilot)
        before = app.export_screenshot()
        scroll, virtual = transcript.scroll_y, transcript.virtual_size.height
        views = transcript.views()

        transcript.freeze_history()
        await pilot.pause()

        hidden = [v for v in views if not v.display]
        assert hidden and hidden == views[: len(hidden)]  # a prefix, never the latest messages
        assert all(v.display for v in views[len(hidden) :])
        assert all(
            v.virtual_region.bottom <= scroll - transcript.size.height for v in hidden
        )  # only messages well above the screen
        assert (transcript.scroll_y, transcript.virtual_size.height) == (scroll, virtual)
        assert app.export_screenshot() == before

        transcript.thaw()
        await pilot.pause()
        assert all(v.display for v in views)
        assert (transcript.scroll_y, transcript.virtual_size.height) == (scroll, virtual)
        assert app.export_screenshot() == before


async def test_a_growing_reply_stands_down_what_it_pushed_up_without_moving_the_view():
    app = TranscriptApp()
    async with app.run_test(size=(80, 24)) as pilot:
        transcript = await shown_at_bottom(pilot)
        up = transcript.scroll_y - 3 * transcript.size.height
        transcript.scroll_to(y=up, animate=False, immediate=True)
        await pilot.pause()
        transcript.freeze_history()  # the turn starts higher up
        await pilot.pause()
        views, virtual = transcript.views(), transcript.virtual_size.height
        first = [v for v in views if not v.display]
        assert first

        transcript.scroll_end(animate=False, immediate=True)  # the reply pushed the rest up
        await pilot.pause()
        before, scroll = app.export_screenshot(), transcript.scroll_y
        transcript.freeze_history()
        await pilot.pause()
        hidden = [v for v in views if not v.display]
        assert len(hidden) > len(first) and hidden == views[: len(hidden)]
        assert (transcript.scroll_y, transcript.virtual_size.height) == (scroll, virtual)
        assert app.export_screenshot() == before

        transcript.thaw()
        await pilot.pause()
        assert all(v.display for v in views) and transcript.virtual_size.height == virtual
        assert app.export_screenshot() == before


async def frozen(pilot, transcript: Transcript) -> None:
    transcript.scroll_end(animate=False, immediate=True)
    await pilot.pause()
    transcript.freeze_history()
    await pilot.pause()
    assert not all(v.display for v in transcript.views())


async def test_scrolling_up_or_a_new_width_brings_the_history_back():
    app = TranscriptApp()
    async with app.run_test(size=(80, 24)) as pilot:
        transcript = await shown_at_bottom(pilot)
        await frozen(pilot, transcript)
        transcript.scroll_up(animate=False)
        await pilot.pause()
        assert all(v.display for v in transcript.views())

        await frozen(pilot, transcript)
        await pilot.resize_terminal(100, 24)
        await pilot.pause()
        assert all(v.display for v in transcript.views())


async def test_a_new_session_starts_with_nothing_stood_down():
    app = TranscriptApp()
    async with app.run_test(size=(80, 24)) as pilot:
        transcript = await shown_at_bottom(pilot)
        await frozen(pilot, transcript)
        await transcript.show_messages(history(1))
        await pilot.pause()
        assert not transcript.query_one("#transcript-frozen").display
        assert [v.display for v in transcript.query(MessageView)] == [True, True]


async def test_a_streaming_reply_grows_inside_held_room_and_gives_it_back_at_the_end():
    """While a reply streams, its message holds room below the text (a third of the terminal's
    height): an update that fits in the room leaves the transcript's height and scroll position
    alone (no scroll, no redraw of the whole transcript); one that nearly fills it renews the room;
    the finished message is as tall as its text."""
    app = TranscriptApp()
    async with app.run_test(size=(80, 24)) as pilot:
        transcript = await shown_at_bottom(pilot)
        reply = await transcript.add_message(MessageView("assistant", streaming=True))
        transcript.scroll_end(animate=False)
        transcript.follow()
        await pilot.pause()
        room = app.size.height // 3
        assert reply.size.height >= room  # held before the first token

        words = " ".join(f"word{i}" for i in range(200))
        await reply.stream_text(words[:20])
        await pilot.pause()
        virtual, scroll = transcript.virtual_size.height, transcript.scroll_y
        await reply.stream_text(words[:60])  # a line more: inside the room
        await pilot.pause()
        assert (transcript.virtual_size.height, transcript.scroll_y) == (virtual, scroll)
        assert "word8" in app.export_screenshot()

        await reply.stream_text(words)  # more than the room: the message grows, the view follows
        await pilot.pause()
        assert transcript.virtual_size.height > virtual and transcript.scroll_y > scroll
        assert transcript.scroll_y == transcript.max_scroll_y
        await reply.stream_text(words + " more")  # the next update renews the room
        await pilot.pause()
        answer = reply.query_one(".answer")
        assert reply.size.height >= answer.outer_size.height + 1 + room
        assert transcript.scroll_y == transcript.max_scroll_y

        await reply.finish(words, "complete")
        await pilot.pause()
        assert reply.styles.min_height is None
        assert reply.size.height == answer.outer_size.height + 1  # the header line, no room


async def test_the_room_is_renewed_before_an_update_like_the_last_would_overflow_it():
    """Updates of a steady size never grow the message past its room (which would scroll the
    transcript at that update and again at the renewal after it)."""
    app = TranscriptApp()
    async with app.run_test(size=(80, 24)) as pilot:
        transcript = await shown_at_bottom(pilot)
        reply = await transcript.add_message(MessageView("assistant", streaming=True))
        transcript.follow()
        await pilot.pause()
        words = [f"w{i:04d}" for i in range(600)]
        renewals, held = 0, reply.styles.min_height
        for n in range(72, 600, 72):  # six lines an update; the room is 8
            await reply.stream_text(" ".join(words[:n]))
            await pilot.pause()
            assert held is not None
            renewals += reply.styles.min_height != held
            held = reply.styles.min_height
            assert held is not None and reply.size.height == held.value  # the text fits
        assert renewals >= 2
