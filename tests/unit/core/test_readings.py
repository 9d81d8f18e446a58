"""GpuReading.down: the one way a GPU that exists but cannot be read is published."""

from __future__ import annotations

from exporter.core.readings import GpuReading


def test_down_keeps_identity_and_drops_readings() -> None:
    r = GpuReading(index=3, uuid="GPU-x", vendor="nvidia", name="H100", pci_bus_id="0000:3b:00.0", serial="S1",
                   driver_version="550", cuda_driver_version="12.4", firmware_version="96.00",
                   power_watts=300.0, temperature_celsius={"gpu": 40.0}, unsupported={"gpu_fan_speed_ratio"})
    d = r.down("GPU is lost")
    assert (d.up, d.up_reason) == (False, "GPU is lost") and r.up
    identity = ("index", "uuid", "vendor", "name", "pci_bus_id", "serial", "driver_version", "cuda_driver_version",
                "firmware_version")
    assert all(getattr(d, a) == getattr(r, a) for a in identity)
    assert d.power_watts is None and d.temperature_celsius == {} and d.unsupported == set()


def test_free_memory_is_the_drivers_else_total_minus_used() -> None:
    driver = GpuReading(0, "a", memory_free_bytes=5.0, memory_total_bytes=10.0, memory_used_bytes=1.0)
    assert driver.free_memory_bytes() == 5
    assert GpuReading(0, "a", memory_total_bytes=10.0, memory_used_bytes=4.0).free_memory_bytes() == 6
    assert GpuReading(0, "a", memory_total_bytes=10.0, memory_used_bytes=12.0).free_memory_bytes() == 0
    assert GpuReading(0, "a", memory_total_bytes=10.0).free_memory_bytes() is None
