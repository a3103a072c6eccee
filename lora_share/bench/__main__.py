import sys

from ..errors import UserError
from .run import main

if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
