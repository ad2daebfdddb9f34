"""A real RTSP camera on loopback: gst-rtsp-server serving a live H.264 or H.265 test pattern.

Run by the *system* Python (Debian's PyGObject and gir1.2-gst-rtsp-server-1.0), not the venv:

    /usr/bin/python3 tests/rtsp_serve.py --port 8554 [--codec h264|h265] [--size 640x480] [--fps 30]
        [--user U --password P] [--drop 0.0]

It prints ``ready PORT`` once it listens, then takes commands on stdin, one per line, and
answers each with ``ok COMMAND``:

``pause``      stop sending frames; every RTSP session and its connection stays open
``resume``     send frames again
``size WxH``   change the resolution of the frames from now on (the encoder renegotiates)
``rate N``     change the frame rate to N fps from now on
``drop P``     drop a fraction P of the encoded frames before packetising (damaged stream)

One pipeline is shared by all clients (``set_shared``), as a camera has one sensor.
"""

from __future__ import annotations

import argparse
import sys
import threading

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402

ENCODERS = {
    # Low-latency encoders, a key frame every second so a client that joins (or reopens) starts
    # decoding within a second; the payloader repeats the parameter sets with every key frame.
    "h264": "x264enc tune=zerolatency speed-preset=ultrafast key-int-max={fps} bitrate=2000 "
    "! video/x-h264,profile=baseline ! rtph264pay name=pay0 pt=96 config-interval=-1",
    "h265": "x265enc tune=zerolatency speed-preset=ultrafast key-int-max={fps} bitrate=2000 "
    "! rtph265pay name=pay0 pt=96 config-interval=-1",
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--codec", choices=sorted(ENCODERS), default="h264")
    ap.add_argument("--size", default="640x480")
    ap.add_argument("--fps", type=int, default=30)
    ap.add_argument("--user")
    ap.add_argument("--password")
    ap.add_argument("--drop", type=float, default=0.0)
    args = ap.parse_args()
    width, height = (int(v) for v in args.size.split("x"))

    Gst.init(None)
    launch = (
        f"( videotestsrc is-live=true pattern=ball animation-mode=running-time "
        f"! capsfilter name=caps caps=video/x-raw,width={width},height={height},framerate={args.fps}/1 "
        f"! valve name=valve drop=false ! videoconvert "
        f"! {ENCODERS[args.codec].format(fps=args.fps)} )"
    )
    # Frames dropped after encoding damage the stream the way lost packets do: the decoder sees
    # missing slices and references.  The identity sits between encoder and payloader.
    launch = launch.replace(" ! rtph26", f" ! identity name=loss drop-probability={args.drop} ! rtph26")

    elements: dict[str, Gst.Element] = {}
    # The camera's state outlives a media: when the last client leaves, the shared media goes, and
    # a client that reopens gets a new one, which must still be paused, resized or lossy.
    state: dict[str, object] = {
        "valve": ("drop", False),
        "caps": (
            "caps",
            Gst.Caps.from_string(f"video/x-raw,width={width},height={height},framerate={args.fps}/1"),
        ),
        "loss": ("drop-probability", args.drop),
    }

    def configured(_factory: GstRtspServer.RTSPMediaFactory, media: GstRtspServer.RTSPMedia) -> None:
        bin_ = media.get_element()
        for name, (prop, value) in state.items():  # type: ignore[misc]
            el = bin_.get_by_name_recurse_up(name)
            if el is not None:
                elements[name] = el
                el.set_property(prop, value)

    def set_(name: str, prop: str, value: object) -> None:
        state[name] = (prop, value)
        if name in elements:
            elements[name].set_property(prop, value)

    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(args.port))
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(launch)
    factory.set_shared(True)
    factory.connect("media-configure", configured)
    if args.user:
        auth = GstRtspServer.RTSPAuth()
        token = GstRtspServer.RTSPToken()
        token.set_string("media.factory.role", "camera-user")
        auth.add_basic(GstRtspServer.RTSPAuth.make_basic(args.user, args.password or ""), token)
        server.set_auth(auth)
        role = Gst.Structure.new_from_string(
            "camera-user, media.factory.access=(boolean)true, media.factory.construct=(boolean)true"
        )
        factory.add_role_from_structure(role)
    server.get_mount_points().add_factory("/cam", factory)
    if server.attach(None) == 0:
        print(f"error cannot listen on 127.0.0.1:{args.port}", flush=True)
        sys.exit(1)

    loop = GLib.MainLoop()

    size = [width, height, args.fps]  # what the camera sends now

    def command(line: str) -> bool:
        word, _, arg = line.strip().partition(" ")
        if word == "pause":
            set_("valve", "drop", True)
        elif word == "resume":
            set_("valve", "drop", False)
        elif word in ("size", "rate"):
            if word == "size":
                size[:2] = [int(v) for v in arg.split("x")]
            else:
                size[2] = int(arg)
            w, h, fps = size
            set_("caps", "caps", Gst.Caps.from_string(f"video/x-raw,width={w},height={h},framerate={fps}/1"))
        elif word == "drop":
            set_("loss", "drop-probability", float(arg))
        else:
            print(f"error unknown command {line.strip()!r}", flush=True)
            return False
        print(f"ok {word}", flush=True)
        return False

    def read_stdin() -> None:
        for line in sys.stdin:
            GLib.idle_add(command, line)
        GLib.idle_add(loop.quit)  # the test closed our stdin: it is done with us

    threading.Thread(target=read_stdin, daemon=True).start()
    print(f"ready {args.port}", flush=True)
    loop.run()


if __name__ == "__main__":
    main()
