"""`python -m playground.bench`, the path the README taught before the commands moved into
`playground/cli/` (issue 31): kept so that scripts written against it keep working. The
command is `playground.cli.bench`."""

from playground.cli.bench import main

if __name__ == "__main__":
    main()
