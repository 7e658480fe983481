from trajlake.schemas import Episode


def test_append_and_read_every_backend(lake):
    r = lake.append({"episodes": [Episode("e1", success=True)]}, stage="test", run_id="r1")
    assert r.inserted == {"episodes": 1}
    assert lake.count("episodes") == 1
