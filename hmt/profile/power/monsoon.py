"""A Monsoon High Voltage Power Monitor (HVPM) through the vendor's Python package.

The package is ``monsoon`` on PyPI (imports as ``Monsoon``; it needs ``pyusb`` and
libusb). The monitor powers the device from its main channel at ``vout`` volts; the sample
engine records main current (mA) and voltage (V) at 5 kHz until told to stop.

The package's ``Connect`` prints "Unable to find device" and carries on when no monitor
is attached, so the USB bus is probed first (vendor 0x2AB9, product 0x0001) and a missing
monitor is reported as such.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from hmt.errors import DeviceError
from hmt.profile.power.base import PowerSource, PowerTrace

MONSOON_USB_VENDOR = 0x2AB9
MONSOON_USB_PRODUCT = 0x0001


def _import_monsoon() -> tuple[Any, Any, Any]:
    try:
        import Monsoon.HVPM as HVPM
        import Monsoon.pmapi as pmapi
        import Monsoon.sampleEngine as sampleEngine
    except ImportError as exc:
        raise DeviceError(
            f"--monsoon needs Monsoon's Python package (import Monsoon failed: {exc}); "
            "install the extra: pip install \"hmt[monsoon]\" (that is: pip install monsoon pyusb)"
        ) from exc
    return HVPM, sampleEngine, pmapi


def _probe_usb(serial: int | None) -> None:
    try:
        import usb.core
    except ImportError as exc:
        raise DeviceError("--monsoon needs pyusb and libusb-1.0: pip install \"hmt[monsoon]\" and "
                          "apt-get install libusb-1.0-0") from exc
    try:
        found = list(usb.core.find(find_all=True, idVendor=MONSOON_USB_VENDOR, idProduct=MONSOON_USB_PRODUCT))
    except Exception as exc:
        raise DeviceError(f"--monsoon: cannot scan USB ({exc}); is libusb-1.0 installed?") from exc
    if not found:
        raise DeviceError(
            f"--monsoon: no Monsoon power monitor on USB (vendor 0x{MONSOON_USB_VENDOR:04x}, product "
            f"0x{MONSOON_USB_PRODUCT:04x}); check the cable, the monitor's power and udev permissions"
        )
    if serial is not None and all(getattr(d, "serial_number", None) != str(serial) for d in found):
        raise DeviceError(f"--monsoon: no monitor with serial {serial} (found {len(found)} other(s))")


class MonsoonSource(PowerSource):
    name = "monsoon"

    def __init__(self, *, vout: float = 4.0, serial: int | None = None, probe_usb: bool = True) -> None:
        if not 0.8 <= vout <= 13.5:
            raise DeviceError(f"--monsoon: vout {vout} V is outside the HVPM's 0.8-13.5 V range")
        self.HVPM, self.sampleEngine, self.pmapi = _import_monsoon()
        if probe_usb:
            _probe_usb(serial)
        self.vout = vout
        self.serial = serial
        self._monitor: Any = None
        self._engine: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._host_start = 0.0
        self._error: BaseException | None = None

    def start(self) -> None:
        monitor = self.HVPM.Monsoon()
        try:  # releases since 2017 take the protocol object; the first ones only the serial
            monitor.setup_usb(self.serial, self.pmapi.USB_protocol())
        except TypeError:
            monitor.setup_usb(self.serial)
        device = getattr(monitor, "DEVICE", None) or getattr(getattr(monitor, "Protocol", None), "DEVICE", None)
        if device is None:
            raise DeviceError("--monsoon: the vendor package found no monitor to connect to")
        monitor.fillStatusPacket()
        monitor.setVout(self.vout)
        engine = self.sampleEngine.SampleEngine(monitor)
        engine.ConsoleOutput(False)
        channels = self.sampleEngine.channels
        for channel in (channels.USBCurrent, channels.AuxCurrent, channels.USBVoltage):
            engine.disableChannel(channel)
        engine.enableChannel(channels.MainCurrent)
        engine.enableChannel(channels.MainVoltage)
        engine.setTriggerChannel(self.sampleEngine.channels.timeStamp)
        engine.setStartTrigger(self.sampleEngine.triggers.GREATER_THAN, 0)
        # The stop trigger is any f(x, level); ours ends sampling when stop() sets the event.
        engine.setStopTrigger(lambda _x, _level: self._stop.is_set(), 0)
        self._monitor, self._engine = monitor, engine
        self._stop.clear()
        self._error = None

        def sample() -> None:
            try:
                engine.startSampling(self.sampleEngine.triggers.SAMPLECOUNT_INFINITE)
            except BaseException as exc:  # noqa: BLE001 - re-raised in stop()
                self._error = exc

        self._host_start = time.time()
        self._thread = threading.Thread(target=sample, name="hmt-monsoon", daemon=True)
        self._thread.start()

    def stop(self) -> PowerTrace:
        if self._thread is None:
            raise RuntimeError("monsoon: stop() before start()")
        self._stop.set()
        self._thread.join(timeout=30)
        self._thread = None
        try:
            if self._error is not None:
                raise DeviceError(f"--monsoon: sampling failed ({self._error})") from self._error
            # getSamples() lists only the enabled channels, in channel order:
            # [time (s since sampling started), main current (mA), main voltage (V)].
            times, current_ma, volts = (np.asarray(c, float) for c in self._engine.getSamples()[:3])
            current_a = current_ma / 1000.0
        finally:
            try:
                self._monitor.setVout(0)
                self._monitor.closeDevice()
            except Exception:  # noqa: BLE001 - best effort: the trace matters more
                pass
        if times.size < 2:
            raise DeviceError("--monsoon: the monitor returned fewer than 2 samples")
        keep = np.concatenate(([True], np.diff(times) > 0))
        return PowerTrace(times[keep] + self._host_start, (current_a * volts)[keep], self.name)
