from tests.fixtures.inprocess import TOKEN, Api, api, broker  # noqa: F401
