"""The queues sqlalchemy_watchdog is compared with, as benchmark subjects
(same operations as :mod:`subjects`). PostgreSQL only; installed from the
project's ``bench`` extra."""
